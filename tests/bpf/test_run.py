"""`refcntd run` against compiled fixtures with known leaks: exact reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import (
    FIXTURES,
    ROOT,
    Result,
    assert_probe_mode,
    cc,
    functions,
    leak_summary,
    refcntd,
)

# The truth documented in examples/perflike.c for the default 100 samples.
PERFLIKE_LEAKS = {"dso": [1, 1, 2], "map": [1, 1, 1, 10], "thread": [1]}
ALLOCATOR = {"dso": "dso__new", "map": "map__new", "thread": "thread__new"}


def lib_spec(tmp_path: Path, library: Path) -> Path:
    """The default spec, with the stubs living in a shared library."""
    text = (ROOT / "configs/specs/perf-stubs.yaml").read_text()
    spec = tmp_path / "lib-spec.yaml"
    spec.write_text(text.replace("roles:\n", f"library: {library}\nroles:\n", 1))
    return spec


def assert_perflike_truth(process: dict) -> None:
    assert process["state"] == "exited"
    assert process["exit_status"] == "exit 0"
    assert leak_summary(process) == PERFLIKE_LEAKS
    for group in process["groups"]:
        names = functions(group)
        assert names[0] == "__refcnt__init", names
        assert names[1] == ALLOCATOR[group["type"]], names  # the caller of the stub
        assert "machine__init" in names and "main" in names, names
    kernel_map = [g for g in process["groups"] if "machine__create_kernel_maps" in functions(g)]
    assert sorted(i["count"] for g in kernel_map for i in g["instances"]) == [1, 10]


@pytest.mark.parametrize("shared", [False, True], ids=["exe", "shared-lib"])
@pytest.mark.parametrize("variant", ["O0", "O2", "O2fp"])
def test_perflike_exact_report(bpf, build, tmp_path, variant, shared, probe_mode):
    exe = build.perflike(variant, shared_stubs=shared)
    spec = ["--spec", str(lib_spec(tmp_path, build.stub_lib(variant)))] if shared else []
    result = refcntd(["run", *spec, "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    report = result.report
    assert_probe_mode(report, probe_mode)
    if shared and probe_mode == "callsites":  # exported: probed at the program's PLT calls
        modules = {p["module"] for p in report["tracing"]["probes"] if p["mode"] == "callsites"}
        assert modules == {str(exe)}, report["tracing"]["probes"]
    assert report["tracing"]["complete"], report["tracing"]
    assert report["command_status"] == 0
    assert len(report["processes"]) == 1
    assert_perflike_truth(report["processes"][0])
    assert "SUMMARY: refcntd: 8 objects of 3 types leaked" in result.stderr


def test_text_report_names_file_and_line(bpf, build, tmp_path):
    result = refcntd(["run", "--", str(build.perflike("O2fp"))])
    assert "map__new+0x" in result.stderr
    assert "perflike.c:" in result.stderr  # fixtures are built with -g
    # leak kinds (the default) part the two maps of one stack: bug 1's, and thread 2's
    assert "Leaked (definitely lost) 1 object of type 'map' (final count 10) allocated at:" \
        in result.stderr
    assert "Leaked (indirectly lost) 1 object of type 'map' (final count 1) allocated at:" \
        in result.stderr


@pytest.mark.parametrize("variant,iterations", [("O0", 20000), ("O2", 3000)])
def test_multithreaded_counts_are_exact(bpf, build, tmp_path, variant, iterations,
                                        probe_mode):
    exe = build.program("mthread", [FIXTURES / "mthread.c"], variant, flags=["-pthread"])
    result = refcntd(["run", "--", str(exe), str(iterations)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert_probe_mode(result.report, probe_mode)
    (process,) = result.report["processes"]
    assert leak_summary(process) == {"shared": [7, 9, 11, 13]}
    gets = sorted(i["gets"] for g in process["groups"] for i in g["instances"])
    assert gets == [8 * iterations + extra for extra in (6, 8, 10, 12)]
    assert result.report["tracing"]["complete"]


def test_fork_exec_child_is_reported(bpf, build, tmp_path):
    """Parent and exec'd child share the stub library the spec names."""
    perflike = build.perflike("O2", shared_stubs=True)
    host = build.program("forkexec", [FIXTURES / "forkexec.c"], "O2", shared_stubs=True)
    spec = lib_spec(tmp_path, build.stub_lib("O2"))
    result = refcntd(["run", "--spec", str(spec), "--", str(host), str(perflike)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    processes = result.report["processes"]
    assert len(processes) == 2, processes
    child, parent = sorted(processes, key=lambda p: p["command"][0] != str(perflike))
    assert child["command"] == [str(perflike)]
    assert parent["command"] == [str(host), str(perflike)]
    assert child["pid"] != parent["pid"]
    assert_perflike_truth(child)
    assert parent["groups"] == [] and parent["exit_status"] == "exit 0"


def test_dlclosed_library_frames_are_symbolized(bpf, build, tmp_path):
    lib = build.stub_lib("O2")
    plugin_dir = tmp_path / "plugins"  # not next to any other module
    plugin = cc(plugin_dir / "libplugin.so", [FIXTURES / "plugin.c"],
                ["-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared", f"-L{lib.parent}",
                 "-lrefcnt", f"-Wl,-rpath,{lib.parent}"])
    host = build.program("dlhost", [FIXTURES / "dlhost.c"], "O2", flags=["-ldl"])
    spec = lib_spec(tmp_path, lib)
    result = refcntd(["run", "--spec", str(spec), "--", str(host), str(plugin)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    assert group["type"] == "widget" and [i["count"] for i in group["instances"]] == [2]
    names = functions(group)
    assert names[:4] == ["__refcnt__init", "widget_new", "plugin_run", "main"], group["stack"]
    assert group["stack"][1]["module"] == str(plugin.resolve())
    assert group["stack"][1].get("file", "").endswith("plugin.c")


def test_short_lived_process(bpf, build, tmp_path):
    exe = build.program("short", [FIXTURES / "short.c"], "O2")
    result = refcntd(["run", "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert process["exit_status"] == "exit 3" and process["exit_code"] == 3
    (group,) = process["groups"]
    assert group["type"] == "blip"
    assert functions(group)[:3] == ["__refcnt__init", "make_blip", "main"]


def test_clean_run_returns_command_status(bpf, build, tmp_path):
    """No leak and complete tracing: refcntd exits with the command's own status."""
    exe = build.program("forkexec", [FIXTURES / "forkexec.c"], "O0")
    result = refcntd(["run", "--", str(exe), "/bin/sh", "-c", "exit 7"], tmp_path / "r.json")
    assert result.returncode == 7, result.stderr
    assert result.report["tracing"]["complete"]
    assert [p["groups"] for p in result.report["processes"]] == [[], []]
    assert "SUMMARY: refcntd: no leaks" in result.stderr




def ctor_run(exe: Path, spec: str, tmp_path: Path, probe_mode: str) -> Result:
    """`refcntd run` on ctor.c's program: the known truth, with the stack of the caller
    the constructor returned to."""
    result = refcntd(["run", "--spec", spec, "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert_probe_mode(result.report, probe_mode)
    (process,) = result.report["processes"]
    assert leak_summary(process) == {"gadget": [3]}
    (group,) = process["groups"]
    assert functions(group)[:2] == ["make_gadget", "main"]  # the constructor has returned
    assert result.report["tracing"]["complete"]
    return result


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_constructor_returning_the_object(bpf, tmp_path, opt, probe_mode):
    exe = cc(tmp_path / "ctor", [FIXTURES / "ctor.c"], [opt, "-fno-omit-frame-pointer"])
    result = ctor_run(exe, "example-ctor", tmp_path, probe_mode)
    roles = sorted(p["role"] for p in result.report["tracing"]["probes"])
    assert roles == ["get", "init", "init_entry", "put"]


def test_exported_constructor_returning_the_object(bpf, tmp_path, probe_mode):
    """The constructor lives in a shared library and the program calls it through its
    PLT: in call-site mode the return value is read after those calls, in the program."""
    lib = cc(tmp_path / "libthing.so", [FIXTURES / "ctor.c"],
             ["-O2", "-fPIC", "-shared", "-DCTOR_API_ONLY"])
    exe = cc(tmp_path / "ctormain", [FIXTURES / "ctor.c"],
             ["-O2", "-fno-omit-frame-pointer", "-DCTOR_MAIN_ONLY", f"-L{tmp_path}", "-lthing",
              f"-Wl,-rpath,{tmp_path}"])
    spec = tmp_path / "ctor-lib.yaml"
    spec.write_text((ROOT / "configs/specs/example-ctor.yaml").read_text().replace(
        "roles:\n", f"library: {lib}\nroles:\n", 1))
    result = ctor_run(exe, str(spec), tmp_path, probe_mode)
    init = [p for p in result.report["tracing"]["probes"] if p["role"] == "init"]
    if probe_mode == "callsites":  # after each call to its PLT stub, in the program
        assert {p["module"]: p["hits"] for p in init} == {str(exe): 3}, init


def test_dropped_records_make_the_run_incomplete(bpf, build, tmp_path):
    """No leak, but the object map overflowed: exit 24, never a clean result."""
    exe = build.program("churn", [FIXTURES / "churn.c"], "O2")
    full = refcntd(["run", "--max-objects", "16", "--", str(exe), "64"], tmp_path / "a.json")
    assert full.returncode == 24, full.stderr
    assert full.report["tracing"]["lost"] == {"inits not recorded: object map full": 48}
    assert "tracing INCOMPLETE" in full.stderr and "48 x inits not recorded" in full.stderr
    assert full.report["leaked_objects"] == 0
    clean = refcntd(["run", "--", str(exe), "64", "5"], tmp_path / "b.json")
    assert clean.returncode == 5, clean.stderr
    assert clean.report["tracing"]["complete"] and clean.report["leaked_objects"] == 0
