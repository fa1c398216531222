"""After `refcntd prebuild`, no start of run, attach or serve compiles, whatever its
options, and each option still does its job (issue 27).

The compile flags only size maps; every option that picks a branch in bpf/ is the
program's run-time configuration (kernel/knobs.py).  With REFCNTD_NO_COMPILE=1 a start
that would need clang (a full or a maps-only compile) fails instead
(kernel/program.py): every start below passes only on the prebuilt program.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, functions, leak_summary, refcntd
from test_attach import Attached
from test_callsites import TRUTH as CALLSITE_TRUTH
from test_callsites import build_fixture as callsite_fixture
from test_run import PERFLIKE_LEAKS, assert_perflike_truth
from test_serve import Serve, target_yaml

from refcntd.paths import SPEC_DIR

CACHED = "cached programs, no compile (bcc not loaded)"
COMPILED = ("BPF compile:", "maps-only compile")  # program.how of a start that compiled
CGROUP2 = Path("/sys/fs/cgroup/unified")  # this machine's cgroup v2 (hybrid layout)


@pytest.fixture(scope="module")
def cache(bpf, tmp_path_factory) -> Path:
    """A program cache filled by `refcntd prebuild` alone: one compile, nothing else."""
    cache = tmp_path_factory.mktemp("prebuilt")
    built = subprocess.run([sys.executable, "-m", "refcntd", "prebuild"], cwd=ROOT,
                           env={**os.environ, "REFCNTD_CACHE": str(cache)},
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    assert built.stdout.count("BPF compile") == 1, built.stdout
    assert built.stdout.count("cached programs, no compile") == 2, built.stdout
    return cache


def no_compile(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "REFCNTD_CACHE": str(cache), "REFCNTD_NO_COMPILE": "1", **extra}


def histories(process: dict, kind: str) -> list[list[dict]]:
    return [i["history"] for g in process["groups"] if g["type"] == kind
            for i in g["instances"] if "history" in i]


def without_delete(tmp_path: Path) -> Path:
    """perf-stubs without its delete role: a put to zero ends an object's life."""
    text = (SPEC_DIR / "perf-stubs.yaml").read_text()
    spec = tmp_path / "no-delete.yaml"
    spec.write_text(text[:text.index("  delete:")].replace("name: perf-stubs",
                                                           "name: no-delete"))
    return spec


RUNS = {  # name: (arguments, environment, check of the one process's report)
    "default": ([], {}, assert_perflike_truth),
    "history-map": (["--history", "map"], {}, lambda p: (
        assert_perflike_truth(p), histories(p, "map"),
        not histories(p, "dso") or pytest.fail("history of a type not asked for"))),
    "history-all-256": (["--history", "all", "--history-depth", "256"], {}, lambda p: (
        assert_perflike_truth(p), histories(p, "dso") or pytest.fail("no dso history"),
        max(len(h) for h in histories(p, "map")) == 12 or pytest.fail("history cut"))),
    "history-all-4": (["--history", "all", "--history-depth", "4"], {}, lambda p: (
        assert_perflike_truth(p),
        max(len(h) for h in histories(p, "map")) == 4 or pytest.fail("depth not kept"))),
    "sizes": (["--max-objects", "4096", "--max-stacks", "1024"], {}, assert_perflike_truth),
    "frame-pointers-only": ([], {"REFCNTD_UNWIND": "fp"}, lambda p: (
        assert_perflike_truth(p),
        {g["unwind"]["method"] for g in p["groups"]} == {"frame pointers"}
        or pytest.fail("not the kernel's frame-pointer walk"))),
    "small-ring": ([], {"REFCNTD_RINGBUF_PAGES": "16"}, assert_perflike_truth),
    "no-delete-role": (["--spec", "NO_DELETE"], {}, lambda p: (
        leak_summary(p) == PERFLIKE_LEAKS or pytest.fail(str(leak_summary(p))))),
}


@pytest.mark.parametrize("name", RUNS)
def test_run_compiles_nothing(bpf, build, tmp_path, cache, name):
    args, env, check = RUNS[name]
    args = [str(without_delete(tmp_path)) if a == "NO_DELETE" else a for a in args]
    result = refcntd(["run", "--verbose", *args, "--", str(build.perflike("O2fp"))],
                     tmp_path / "r.json", env=no_compile(cache, **env))
    assert result.returncode == 23, result.stderr
    assert CACHED in result.stderr, result.stderr
    assert not any(c in result.stderr for c in COMPILED), result.stderr
    assert result.report["tracing"]["complete"], result.report["tracing"]
    (process,) = result.report["processes"]
    check(process)


@pytest.mark.parametrize("extra", [[], ["--history", "map", "--history-depth", "8"]],
                         ids=["default", "history"])
def test_attach_compiles_nothing(bpf, build, tmp_path, cache, extra, monkeypatch):
    """System-wide: per-site counts, the exit code read at its BTF offset."""
    perflike = build.perflike("O2fp")
    for name, value in no_compile(cache).items():  # Attached's process inherits them
        monkeypatch.setenv(name, value)
    with Attached(["--verbose", *extra, "--binary", str(perflike)], tmp_path / "a.json") as att:
        assert subprocess.run([str(perflike)], capture_output=True).returncode == 0
        time.sleep(0.5)
        code, _, report = att.stop()
    assert CACHED in att.seen and not any(c in att.seen for c in COMPILED), att.seen
    (process,) = report["processes"]
    assert_perflike_truth(process)
    assert bool(histories(process, "map")) == bool(extra)


def test_serve_filters_and_holding_compile_nothing(bpf, build, tmp_path, cache):
    """serve's comm and cgroup filters, history, and holding for exported call sites:
    each target its own start, none compiles, each filter keeps exactly its processes."""
    perflike = build.perflike("O2fp")
    copies = {}
    for name in ("bycomm", "nocomm", "bycgroup"):
        copies[name] = tmp_path / name
        shutil.copy(perflike, copies[name])
    exe, plugin = callsite_fixture(build, tmp_path)
    cgroup = CGROUP2 / f"refcntd-test-{os.getpid()}"
    cgroup.mkdir()
    targets = (target_yaml("bycomm", copies["bycomm"], extra="    comm: [bycomm]\n"
                           "    history: [map]\n")
               + target_yaml("nocomm", copies["nocomm"], extra="    comm: [someone-else]\n")
               + target_yaml("bycgroup", copies["bycgroup"],
                             extra=f"    cgroup: /{cgroup.name}\n")
               + target_yaml("csmain", exe))
    try:
        with Serve(tmp_path, targets, env=no_compile(cache)) as serve:
            outside = subprocess.Popen([str(copies["bycgroup"])], stdout=subprocess.DEVNULL)
            filtered = subprocess.Popen([str(copies["nocomm"])], stdout=subprocess.DEVNULL)
            inside = subprocess.Popen(["sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"}; '
                                       f'exec {copies["bycgroup"]}'], stdout=subprocess.DEVNULL)
            bycomm = subprocess.Popen([str(copies["bycomm"])], stdout=subprocess.DEVNULL)
            held = subprocess.Popen([str(exe), str(plugin)], stdout=subprocess.DEVNULL)
            for proc in (outside, filtered, inside, bycomm, held):
                assert proc.wait(timeout=60) == 0
            for name, proc in (("bycgroup", inside), ("bycomm", bycomm), ("csmain", held)):
                serve.wait_log(f"target={name} pid={proc.pid} ", 30)
            time.sleep(0.5)
            assert serve.stop() == 0, serve.log
    finally:
        cgroup.rmdir()
    assert "cannot attach" not in serve.log and "REFCNTD_NO_COMPILE" not in serve.log, serve.log
    assert f"pid={outside.pid} " not in serve.log and f"pid={filtered.pid} " not in serve.log
    reports = {p["pid"]: p for path in serve.reports.glob("*.json")
               for p in json.loads(path.read_text())["processes"]}
    assert leak_summary(reports[inside.pid]) == PERFLIKE_LEAKS
    assert leak_summary(reports[held.pid]) == CALLSITE_TRUTH
    assert histories(reports[bycomm.pid], "map") and not histories(reports[bycomm.pid], "dso")
    assert all(functions(g)[0] == "__refcnt__init" for g in reports[bycomm.pid]["groups"])
