"""Call-site probes on -O2 stubs: every way into a stub counted exactly, or the
entry probe kept with the reason (executable, PLT callers in a library, a
function-pointer table, a plugin dlopen'ed while traced)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, FIXTURES, Build, cc, functions, leak_summary, refcntd

TRUTH = {"obj": [1, 2, 4]}
GETS_PUTS = [(1, 1), (2, 1), (3, 0)]


def build_fixture(build: Build, tmp_path: Path) -> tuple[Path, Path]:
    """csmain (stubs at -O2, get/put exported to libraries), libcsuser.so, csplugin.so."""
    stubs = build.root / "O2" / "refcnt.o"
    if not stubs.exists():
        cc(stubs, [EXAMPLES / "refcnt.c"], ["-O2", "-c"])
    inc = [f"-I{EXAMPLES}", "-O2", "-fno-omit-frame-pointer"]
    cc(tmp_path / "libcsuser.so", [FIXTURES / "csuser.c"], [*inc, "-fPIC", "-shared"])
    plugin = cc(tmp_path / "plugins" / "csplugin.so", [FIXTURES / "csplugin.c"],
                [*inc, "-fPIC", "-shared"])
    exports = tmp_path / "exports.list"
    exports.write_text("{ __refcnt__get; __refcnt__put; };\n")
    exe = cc(tmp_path / "csmain", [FIXTURES / "csmain.c", stubs],
             [*inc, f"-L{tmp_path}", "-lcsuser", f"-Wl,-rpath,{tmp_path}",
              f"-Wl,--dynamic-list={exports}", "-ldl"])
    return exe, plugin


@pytest.mark.parametrize("mode", ["auto", "callsites", "entry"])
def test_every_caller_counted_exactly(bpf, build, tmp_path, mode):
    exe, plugin = build_fixture(build, tmp_path)
    result = refcntd(["run", "--probe-mode", mode, "--", str(exe), str(plugin)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    report = result.report
    assert report["tracing"]["complete"], report["tracing"]
    (process,) = report["processes"]
    assert process["exit_status"] == "exit 0"
    assert leak_summary(process) == TRUTH
    instances = sorted((i["gets"], i["puts"]) for g in process["groups"]
                       for i in g["instances"])
    assert instances == GETS_PUTS
    for group in process["groups"]:
        assert functions(group)[:3] == ["__refcnt__init", "obj_new", "main"], group["stack"]
    modes = {p["role"]: p["mode"] for p in report["tracing"]["probes"]}
    expected_init = "entry" if mode == "entry" else "callsites"
    assert modes == {"init": expected_init, "get": "entry", "put": "entry", "delete": "entry"}


def test_check_reports_modes_and_reasons(build, tmp_path):
    exe, _ = build_fixture(build, tmp_path)
    out = refcntd(["check", "--probe-mode", "auto", "--binary", str(exe)]).stdout
    text = out.splitlines()
    lines = {line.split()[1]: (line, text[i + 1]) for i, line in enumerate(text)
             if line.startswith("mode ")}
    init, init_why = lines["init"]
    assert ": callsites, 1 probe(s), emulated [call 0x" in init
    assert "the entry probe would be single-stepped" in init_why
    for role in ("get", "put"):
        line, why = lines[role]
        assert ": entry, 1 probe(s), single-step" in line
        assert "is exported in .dynsym" in why and "dlsym, libraries loaded later" in why
        assert why.endswith(f"imported by {tmp_path / 'libcsuser.so'}"), why
    delete, delete_why = lines["delete"]
    assert ": entry, 1 probe(s), single-step" in delete
    assert "address stored in data" in delete_why and "function-pointer table" in delete_why


@pytest.mark.parametrize("mode", ["callsites", "entry"])
def test_conditional_tail_jumps_count_only_when_taken(bpf, build, tmp_path, mode):
    exe = build.program("condtail", [FIXTURES / "condtail.c"], "O2")
    result = refcntd(["run", "--probe-mode", mode, "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert process["exit_status"] == "exit 0"
    assert leak_summary(process) == {"cobj": [5]}
    (group,) = process["groups"]
    (obj,) = group["instances"]
    assert (obj["gets"], obj["puts"]) == (7, 3)
    probes = {p["role"]: p for p in result.report["tracing"]["probes"]}
    assert probes["get"]["mode"] == probes["put"]["mode"] == mode
