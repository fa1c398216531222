"""Call-site probes on -O2 stubs: every way into a stub counted exactly, or the
entry probe kept with the reason (executable, PLT callers in a library, a
function-pointer table, a plugin dlopen'ed while traced)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import EXAMPLES, FIXTURES, Build, cc, functions, leak_summary, refcntd

from refcntd.kernel.program import EXEC_SPARE_PROBES, HOLD_SPARE_PROBES

TRUTH = {"obj": [1, 2, 4]}
GETS_PUTS = [(1, 1), (2, 1), (3, 0)]


def build_fixture(build: Build, tmp_path: Path, plugin_source: str = "csplugin.c"
                  ) -> tuple[Path, Path]:
    """csmain (stubs at -O2, get/put exported to libraries), libcsuser.so, a plugin."""
    stubs = build.root / "O2" / "refcnt.o"
    if not stubs.exists():
        cc(stubs, [EXAMPLES / "refcnt.c"], ["-O2", "-c"])
    inc = [f"-I{EXAMPLES}", "-O2", "-fno-omit-frame-pointer"]
    cc(tmp_path / "libcsuser.so", [FIXTURES / "csuser.c"], [*inc, "-fPIC", "-shared"])
    plugin = cc(tmp_path / "plugins" / "csplugin.so", [FIXTURES / plugin_source],
                [*inc, "-fPIC", "-shared"])
    exports = tmp_path / "exports.list"
    exports.write_text("{ __refcnt__get; __refcnt__put; };\n")
    exe = cc(tmp_path / "csmain", [FIXTURES / "csmain.c", stubs],
             [*inc, f"-L{tmp_path}", "-lcsuser", f"-Wl,-rpath,{tmp_path}",
              f"-Wl,--dynamic-list={exports}", "-ldl"])
    return exe, plugin


def run_exact(exe: Path, plugin: Path, mode: str, tmp_path: Path) -> dict:
    """`refcntd run` on csmain with `plugin`: the known truth, exactly; the report."""
    result = refcntd(["run", "--probe-mode", mode, "--", str(exe), str(plugin)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert process["exit_status"] == "exit 0"
    assert leak_summary(process) == TRUTH
    instances = sorted((i["gets"], i["puts"]) for g in process["groups"]
                       for i in g["instances"])
    assert instances == GETS_PUTS
    return result.report


@pytest.mark.parametrize("mode", ["auto", "callsites", "entry"])
def test_every_caller_counted_exactly(bpf, build, tmp_path, mode):
    exe, plugin = build_fixture(build, tmp_path)
    report = run_exact(exe, plugin, mode, tmp_path)
    assert report["tracing"]["complete"], report["tracing"]
    (process,) = report["processes"]
    for group in process["groups"]:
        assert functions(group)[:3] == ["__refcnt__init", "obj_new", "main"], group["stack"]
    probes = report["tracing"]["probes"]
    sites = "entry" if mode == "entry" else "callsites"
    modes = {(p["role"], p["mode"]) for p in probes}
    assert modes == {("init", sites), ("get", sites), ("put", sites), ("delete", "entry")}
    if mode == "entry":
        return
    # exported get/put: probed at the PLT calls of libcsuser.so too, and in the plugin,
    # which was scanned while csmain waited in its dlopen
    hits = {(p["role"], Path(p["module"]).name): p["hits"] for p in probes}
    assert hits[("get", "libcsuser.so")] == 2 and hits[("put", "libcsuser.so")] == 1, hits
    assert hits[("get", "csplugin.so")] == 3, hits
    notes = " | ".join(report["tracing"]["notes"])
    assert "1 stop(s) of a traced process to scan" in notes, notes
    assert "call-site probe(s) added in " + str(plugin) in notes, notes


@pytest.mark.parametrize(("source", "why"), [
    ("csplugin_ptr.c", "{plugin} was mapped: {plugin}: relocation at 0x"),
    ("csplugin_dlsym.c", "dlsym handed its address to process ")])
def test_plugin_taking_the_address_moves_the_function_back_to_its_entry(bpf, build,
                                                                        tmp_path, source, why):
    """A module mapped later that keeps the function's address, or gets it from dlsym:
    the role goes back to its entry probe before the address can be used, and every
    count stays exact."""
    exe, plugin = build_fixture(build, tmp_path, source)
    report = run_exact(exe, plugin, "auto", tmp_path)
    gets = [p for p in report["tracing"]["probes"] if p["role"] == "get"]
    entry = [p for p in gets if p["mode"] == "entry"]
    assert len(entry) == 1 and entry[0]["hits"] == 3, gets
    assert "back from call sites" in entry[0]["reason"], entry
    notes = " | ".join(report["tracing"]["notes"])
    assert "get __refcnt__get: moved back to its entry probe (single-stepped) since " \
        + why.format(plugin=plugin) in notes, notes
    puts = {p["mode"] for p in report["tracing"]["probes"] if p["role"] == "put"}
    assert puts == {"callsites"}  # only the function whose address was taken moves


def test_check_reports_modes_and_reasons(build, tmp_path):
    exe, _ = build_fixture(build, tmp_path)
    out = refcntd(["check", "--probe-mode", "auto", "--binary", str(exe)]).stdout
    text = out.splitlines()
    lines = {line.split()[1]: (line, text[i + 1]) for i, line in enumerate(text)
             if line.startswith("mode ")}
    init, init_why = lines["init"]
    assert ": callsites, 1 probe(s), emulated [call 0x" in init
    assert "the entry probe would be single-stepped" in init_why
    for role, sites in (("get", 3), ("put", 2)):  # in csmain and libcsuser.so
        line, why = lines[role]
        assert f": callsites, {sites} probe(s), emulated" in line, line
        assert " libcsuser.so:0x" in line, line  # the PLT callers, by module
        assert f"PLT calls from {tmp_path / 'libcsuser.so'} included" in why, why
        assert "every module mapped later is scanned" in why, why
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


def test_spare_probe_slots_used_up_moves_the_function_back(bpf, build, tmp_path):
    """A plugin with more call sites than the spare probe slots: `get` goes back to
    its entry probe while the plugin's dlopen waits, and counts stay exact.  (The
    first run of a binary reserves 32 768 slots; later runs the last plan's count
    plus the spare slots, which under `run` also keep room for the programs the tree
    execs: the second run is the one that overflows.)"""
    exe, _ = build_fixture(build, tmp_path)
    gets = 2 * (HOLD_SPARE_PROBES + EXEC_SPARE_PROBES) + 100
    source = tmp_path / "many_gets.c"
    source.write_text('#include "refcnt.h"\nstruct obj { atomic_t refcnt; int id; };\n'
                      "void plugin_touch(struct obj *o)\n{\n"
                      + "\trefcnt__get(o, refcnt);\n" * gets + "}\n")
    plugin = cc(tmp_path / "plugins" / "many.so", [source],
                [f"-I{EXAMPLES}", "-O2", "-fPIC", "-shared"])
    for run in ("first", "second"):
        result = refcntd(["run", "--", str(exe), str(plugin)], tmp_path / f"{run}.json")
        assert result.returncode == 23, result.stderr
        (process,) = result.report["processes"]
        assert leak_summary(process) == {"obj": [1, 2, 1 + gets]}, run
        assert sorted((i["gets"], i["puts"]) for g in process["groups"]
                      for i in g["instances"]) == [(1, 1), (2, 1), (gets, 0)], run
    notes = " | ".join(result.report["tracing"]["notes"])
    assert f"{plugin} was mapped and the spare probe slots are used up" in notes, notes


def test_without_the_mapping_hooks_exported_functions_go_back_to_entry(bpf, build, tmp_path):
    """A kernel whose BTF lacks a field the unwinder's mapping hooks read cannot stop a
    process that maps a module: the exported functions' call sites are not enough, and
    their entry probes count instead (a kernel simulated by the BTF offset cache)."""
    from refcntd.kernel import btf
    offsets = {f"{struct}.{member}": btf.member_offset(struct, member)
               for struct, member in btf.UNWIND_MEMBERS.values()}
    offsets["super_block.s_dev"] = None
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / btf._cache_file(btf.VMLINUX_BTF).name).write_text(json.dumps(offsets))
    exe, plugin = build_fixture(build, tmp_path)
    result = refcntd(["run", "--", str(exe), str(plugin)], tmp_path / "r.json",
                     env=dict(os.environ, REFCNTD_CACHE=str(cache)), timeout=300)
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert leak_summary(process) == TRUTH
    assert sorted((i["gets"], i["puts"]) for g in process["groups"]
                  for i in g["instances"]) == GETS_PUTS
    notes = " | ".join(result.report["tracing"]["notes"])
    for role in ("get __refcnt__get", "put __refcnt__put"):
        assert f"{role}: moved back to its entry probe (single-stepped) since the kernel " \
            "side cannot follow modules mapped later" in notes, notes
