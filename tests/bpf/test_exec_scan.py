"""`run -- make check` where each test program carries its own copy of the stubs
(issue 30 item 4): every program the traced tree execs that has the spec's
functions is probed at its exec, before it runs, and counted exactly."""

from __future__ import annotations

import os

from conftest import refcntd
from test_run import assert_perflike_truth

# O2: no frame pointers, call-site probes; O2fp: frame pointers; two files, two copies
VARIANTS = ("O2", "O2fp")


def script(tmp_path, lines: list[str]):
    path = tmp_path / "check.sh"
    path.write_text("#!/bin/sh\nset -e\n" + "".join(f"{line}\n" for line in lines))
    path.chmod(0o755)
    return path


def test_each_test_program_with_its_own_stubs_is_probed_at_exec(bpf, build, tmp_path):
    progs = [build.perflike(v) for v in VARIANTS]
    # each program twice (a second exec of a file is not stopped again), and a program
    # without the functions (true) in between
    check = script(tmp_path, [f"{p} > /dev/null" for p in progs] + ["true"]
                   + [f"{p} > /dev/null" for p in progs])
    result = refcntd(["run", "--", str(check)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    report = result.report
    assert any("has none of the spec's functions" in n  # sh: the command itself
               for n in report["tracing"]["notes"]), report["tracing"]["notes"]
    runs = [p for p in report["processes"] if p["comm"] == "perflike"]
    assert len(runs) == 2 * len(progs), [p["command"] for p in report["processes"]]
    for process in runs:
        assert_perflike_truth(process)  # exact objects, counts and stacks, every run
    others = [p for p in report["processes"] if p["comm"] != "perflike"]
    assert others and all(not p["groups"] for p in others)
    tracing = report["tracing"]
    assert tracing["complete"], tracing
    added = [n for n in tracing["notes"] if "exec'd by the traced tree" in n]
    assert sorted(a.split(" in ")[1].split(",")[0] for a in added) == \
        sorted(str(p) for p in progs), tracing["notes"]
    assert tracing["stacks_cut"] == 0, tracing


def test_a_tree_that_never_runs_the_functions_is_incomplete(bpf, tmp_path):
    """A spec whose functions no program of the tree has: not a clean result."""
    check = script(tmp_path, ["true", "/bin/echo hello"])
    result = refcntd(["run", "--", str(check)], tmp_path / "r.json")
    assert result.returncode == 24, result.stderr
    lost = result.report["tracing"]["lost"]
    assert lost == {"no program the command ran had the spec's functions "
                    "(delete, get, init, put)": 1}, lost
    assert "tracing INCOMPLETE" in result.stderr
    # the script itself is exec'd, never mapped: no unwind table is missing for it
    assert not [n for n in result.report["tracing"]["notes"] if "a script" in n]


def test_the_command_itself_is_not_probed_twice(bpf, build, tmp_path):
    """The command's own functions are planned before it starts: its exec adds none."""
    prog = build.perflike("O2")
    result = refcntd(["run", "--", str(prog)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert_perflike_truth(process)
    notes = result.report["tracing"]["notes"]
    assert not [n for n in notes if "exec'd by the traced tree" in n], notes
    assert os.path.exists(prog)
