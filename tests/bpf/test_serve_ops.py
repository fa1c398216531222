"""What an operator changes while serve runs: SIGHUP tells the truth, retention runs alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import EXAMPLES, FIXTURES, cc, leak_summary
from test_run import PERFLIKE_LEAKS
from test_serve import Serve, free_port, metric, target_yaml

from refcntd.binary.elf import read_build_id


def test_reload_applies_what_it_can_and_says_what_needs_a_restart(bpf, build, tmp_path):
    exe = build.program("service", [FIXTURES / "service.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        new_dir = tmp_path / "elsewhere"
        new_dir.mkdir()
        for i in range(5):  # old reports in the new directory, beyond max_reports
            for suffix in (".json", ".txt"):
                (new_dir / f"2020010{i}T000000.000000Z-svc-{i}{suffix}").write_text("{}\n")
        old_port = serve.port
        serve.config.write_text(
            f"version: 1\nlisten: 127.0.0.1:{free_port()}\nreport_dir: {new_dir}\n"
            "retention: {max_reports: 2}\ntargets:\n"
            + target_yaml("svc", exe, extra="    age_threshold: 42s\n"))
        serve.proc.send_signal(signal.SIGHUP)
        serve.wait_log("reloaded")
        assert f"needs a restart; still listening on 127.0.0.1:{old_port}" in serve.log
        assert f"report_dir {serve.reports} -> {new_dir}" in serve.log
        assert "target=svc age_threshold 300s -> 42s" in serve.log
        # retention applied at once, without waiting for the next report
        assert sorted(p.name for p in new_dir.glob("*.json")) == [
            "20200103T000000.000000Z-svc-3.json", "20200104T000000.000000Z-svc-4.json"]
        assert serve.scrape()  # still served on the old port
        assert serve.stop() == 0


def _report_of(serve: Serve, pid: int) -> dict:
    serve.wait_log(f"pid={pid} ", 30)
    found = [p for p in serve.reports.glob(f"*-{pid}.json")]
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def _wait_count(serve: Serve, needle: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while serve.log.count(needle) < n and time.monotonic() < deadline:
        _read_some(serve)
    assert serve.log.count(needle) >= n, serve.log


def _read_some(serve: Serve) -> None:
    try:
        serve.wait_log("\0", 0.5)  # a needle never logged: just reads for 0.5 s
    except AssertionError:
        pass


def test_replaced_binary_is_traced_again(bpf, build, tmp_path):
    target = tmp_path / "perf"
    shutil.copy(build.perflike("O2fp"), target)
    with Serve(tmp_path, target_yaml("perf", target)) as serve:
        _traced_run(serve, target)
        before = attached_binaries(serve.scrape())
        _upgrade(serve, target, build.perflike("O2"))
        report = _traced_run(serve, target)
        assert report["tracing"]["complete"], report["tracing"]
        after = attached_binaries(serve.scrape())
        assert serve.stop() == 0
    ids = {build_id(build.perflike(v)) for v in ("O2fp", "O2")}
    assert len(ids) == 2 and set(before) | set(after) == ids
    assert before[build_id(build.perflike("O2fp"))] < after[build_id(build.perflike("O2"))]


def _traced_run(serve: Serve, target: Path) -> dict:
    """`target` (a perflike) run once: its report, with perflike's leaks."""
    proc = subprocess.Popen([str(target)], stdout=subprocess.DEVNULL)
    assert proc.wait(60) == 0
    report = _report_of(serve, proc.pid)
    assert leak_summary(report["processes"][0]) == PERFLIKE_LEAKS
    return report


def _upgrade(serve: Serve, target: Path, new: Path) -> None:
    """A package upgrade: the new file (another build) renamed over the old path, and
    serve attached to it."""
    staged = target.with_name(target.name + ".dpkg-new")
    shutil.copy(new, staged)
    os.replace(staged, target)
    serve.wait_log(f"binary={target} replaced (new inode)", 30)
    serve.wait_log(f"binary={target} appeared: attaching", 30)
    _wait_count(serve, f"binary={target} attached", 2)


def _same_stubs_other_call_sites(out: Path) -> tuple[Path, Path]:
    """Two builds of perflike whose refcount stubs sit at the same addresses (their
    object linked first, in .text.unlikely, which leads .text) and whose callers were
    compiled differently: an upgrade that moves the call sites and not the probed
    functions."""
    out.mkdir()
    stubs = cc(out / "refcnt.o", [EXAMPLES / "refcnt.c"], ["-O2", "-c"])
    subprocess.run(["objcopy", "--rename-section", ".text=.text.unlikely", str(stubs)],
                   check=True)
    builds = []
    for name, flags in (("old", []), ("new", ["-fno-inline-functions-called-once",
                                              "-fno-optimize-sibling-calls"])):
        obj = cc(out / f"{name}.o", [EXAMPLES / "perflike.c"],
                 ["-O2", "-fno-omit-frame-pointer", "-c", *flags])
        builds.append(cc(out / name, [stubs, obj], []))
    return builds[0], builds[1]


def _stubs(path: Path) -> dict[str, list[int]]:
    from refcntd.binary.elf import ElfImage
    return {name: [s.vaddr for s in syms] for name, syms in ElfImage(path).symbols.items()
            if "refcnt__" in name}


def test_upgrade_that_keeps_the_stubs_gets_its_own_call_sites(bpf, tmp_path):
    """A new build whose probed functions kept their addresses but whose callers moved:
    serve plans the call sites of the new build, never the old build's offsets (each a
    uprobe in the middle of some instruction of the new one)."""
    from refcntd.binary.plan import build_plan
    from refcntd.inputs.spec import load_spec

    old, new = _same_stubs_other_call_sites(tmp_path / "builds")
    spec = load_spec("perf-stubs")
    sites = [sorted(s.probe_offset for s in build_plan(spec, str(b)).sites) for b in (old, new)]
    assert _stubs(old) == _stubs(new) and len(_stubs(old)) == 4
    assert sites[0] != sites[1], "the builds' call sites should differ"
    target = tmp_path / "perf"
    shutil.copy(old, target)
    with Serve(tmp_path, target_yaml("perf", target),
               env={"REFCNTD_PROBE_MODE": "callsites"}) as serve:
        _traced_run(serve, target)
        _upgrade(serve, target, new)
        report = _traced_run(serve, target)  # without the fix: SIGSEGV
        assert report["tracing"]["complete"], report["tracing"]
        assert serve.stop() == 0


def attached_binaries(samples: dict) -> dict[str, float]:
    """build-id -> attach time, from refcntd_binary_attached_since_seconds."""
    out = {}
    for (name, labels), value in samples.items():
        if name == "refcntd_binary_attached_since_seconds":
            out[dict(labels)["build_id"]] = value
    assert len(out) == 1, out  # one binary per path: the replaced one's series is gone
    return out


def build_id(path: Path) -> str | None:
    return read_build_id(path)


def test_binary_created_after_start_is_attached(bpf, build, tmp_path):
    target = tmp_path / "later"
    with Serve(tmp_path, target_yaml("later", target)) as serve:
        assert f"binary={target} cannot attach" in serve.log
        shutil.copy(build.perflike("O2fp"), target)
        serve.wait_log(f"binary={target} attached", 60)
        proc = subprocess.Popen([str(target)], stdout=subprocess.DEVNULL)
        assert proc.wait(60) == 0
        assert leak_summary(_report_of(serve, proc.pid)["processes"][0]) == PERFLIKE_LEAKS
        assert metric(serve.scrape(), "refcntd_target_attach_errors", target="later") == 0
        assert serve.stop() == 0


def test_type_labels_stay_within_the_cap(bpf, build, tmp_path):
    exe = build.program("manytypes", [FIXTURES / "manytypes.c"])
    extra = "    max_type_labels: 50\n"
    with Serve(tmp_path, target_yaml("many", exe, extra=extra)) as serve:
        proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            samples = serve.scrape()
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    live = {dict(labels)["type"]: v for (name, labels), v in samples.items()
            if name == "refcntd_live_objects" and dict(labels)["target"] == "many"}
    assert len(live) == 50 and "_other" in live, sorted(live)
    assert sum(live.values()) == 1000  # folded, never dropped
    assert live["_other"] == 1000 - 49
    assert metric(samples, "refcntd_type_labels_folded", target="many") == 1000 - 49
    series = {labels for (name, labels) in samples if name.startswith("refcntd_")
              and dict(labels).get("target") == "many" and "type" in dict(labels)}
    assert len({dict(labels)["type"] for labels in series}) == 50


def test_types_gone_are_pruned_so_new_types_keep_their_names(bpf, build, tmp_path):
    """1 500 type names over a program's life, one live at a time, against a kernel
    type table of 1 024: every name is still counted under its own label."""
    exe = build.program("churntypes", [FIXTURES / "churntypes.c"])
    n = 1500
    with Serve(tmp_path, target_yaml("churn", exe, extra="    max_type_labels: 2000\n")) as serve:
        proc = subprocess.run([str(exe), str(n)], timeout=120)
        assert proc.returncode == 0
        serve.wait_log("target=churn pid=", 60)
        samples = serve.scrape()
        assert serve.stop() == 0
    inits = {dict(labels)["type"]: v for (name, labels), v in samples.items()
             if name == "refcntd_operations_total" and dict(labels)["target"] == "churn"
             and dict(labels)["operation"] == "init"}
    named = {t: v for t, v in inits.items() if v}
    assert named == {f"c{i}": 1 for i in range(n)}, serve.log[-3000:]
    assert metric(samples, "refcntd_types_pruned_total", target="churn") >= n - 1024
    assert metric(samples, "refcntd_dropped_records_total", target="churn",
                  reason="type_map_full") == 0
