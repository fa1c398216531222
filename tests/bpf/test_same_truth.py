"""attach, serve and run tell the same truth about a user's own -O2 library (issue 29).

The user's library (libbuf.so: buf_new / buf_ref / buf_unref) and program
(bufprog: a reference leaked in audit_request every 4th request, a balanced
cache in remember_last) are built as users build them: -O2 -g, no frame
pointers, unstripped.  The program is started only after refcntd is attached,
so in attach and serve its executable is a module refcntd never saw: its
unwind tables must be loaded before its first event (the process is held at
the mmap of libbuf.so until they are), or every stack stops at bufprog.

Truth for `bufprog 12`: 3 buffers leak, final count 1, each made by buf_new
in handle called by main; the reference never put was got in audit_request.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, refcntd
from test_attach import Attached
from test_serve import Serve, target_yaml

REQUESTS = 12
RUNS = 3  # identical processes per mode: the same report each time


@pytest.fixture(scope="module")
def user_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(libbuf.so, bufprog, spec): what the user built, and the spec `spec draft` gave."""
    d = tmp_path_factory.mktemp("user")
    flags = ["-O2", "-g", "-fomit-frame-pointer"]
    lib, prog = d / "libbuf.so", d / "bufprog"
    subprocess.run(["gcc", *flags, "-fPIC", "-shared", "-o", str(lib),
                    str(FIXTURES / "libbuf.c")], check=True)
    subprocess.run(["gcc", *flags, f"-I{FIXTURES}", "-o", str(prog),
                    str(FIXTURES / "bufprog.c"), f"-L{d}", "-lbuf", f"-Wl,-rpath,{d}"],
                   check=True)
    draft = refcntd(["spec", "draft", "--library", str(lib)])
    assert draft.returncode == 0, draft.stderr
    spec = d / "buf.yaml"  # the user checked the draft and removed its draft line
    spec.write_text("".join(line for line in draft.stdout.splitlines(keepends=True)
                            if line.strip() != "draft: true"))
    return lib, prog, spec


def truth_of(process: dict) -> tuple:
    """What must be the same in every mode and every run: per leak group, its type, the
    functions of its stack, its objects' (count, gets, puts), and the culprit."""
    assert process["exit_code"] == 0, process
    out = []
    for group in process["groups"]:
        assert not group["stack_truncated"], group
        out.append((group["type"], tuple(f.get("function", "?") for f in group["stack"]),
                    tuple(sorted((i["count"], i["gets"], i["puts"])
                                 for i in group["instances"])),
                    tuple((c["kind"], c["function"]) for c in group["culprits"])))
    return tuple(sorted(out))


EXPECTED = (("buf", ("handle", "main", "__libc_start_call_main", "__libc_start_main_impl",
                     "_start"),
             ((1, 2, 2),) * (REQUESTS // 4),
             (("missing put", "audit_request"),)),)


def assert_whole(process: dict) -> None:
    assert truth_of(process) == EXPECTED, json.dumps(process["groups"], indent=1)[:4000]
    cut = [n for n in process["notes"] if "stacks cut" in n or "truncated" in n]
    assert not cut, process["notes"]


def test_run_of_a_script_that_execs_the_program(bpf, user_build, tmp_path):
    """`run -- ./script`: the program the script starts is a new module too."""
    lib, prog, spec = user_build
    script = tmp_path / "run.sh"
    script.write_text(f"#!/bin/sh\nfor i in 1 2 3; do {prog} {REQUESTS}; done\necho done\n")
    script.chmod(0o755)
    result = refcntd(["run", "--spec", str(spec), "--history", "buf", "--", str(script)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    progs = [p for p in result.report["processes"] if p["comm"] == "bufprog"]
    assert len(progs) == RUNS
    for process in progs:
        assert_whole(process)
    assert result.report["tracing"]["complete"], result.report["tracing"]
    assert result.report["tracing"]["stacks_cut"] == 0, result.report["tracing"]


def test_attach_and_serve_agree_with_run(bpf, user_build, tmp_path):
    lib, prog, spec = user_build
    direct = refcntd(["run", "--spec", str(spec), "--history", "buf", "--", str(prog),
                      str(REQUESTS)], tmp_path / "run.json")
    assert direct.returncode == 23, direct.stderr
    assert_whole(direct.report["processes"][0])

    with Attached(["--binary", str(lib), "--spec", str(spec), "--history", "buf"],
                  tmp_path / "a.json") as att:
        pids = [subprocess.run([str(prog), str(REQUESTS)], capture_output=True, check=True)
                for _ in range(RUNS)]
        assert pids
        code, _out, report = att.stop()
    assert code == 0, att.err  # attach: 0 once detached with tracing complete, leaks or not
    assert len(report["processes"]) == RUNS
    for process in report["processes"]:
        assert_whole(process)
    assert any("unwind tables were loaded" in n for n in report["tracing"]["notes"]), \
        report["tracing"]["notes"]
    assert report["tracing"]["stacks_cut"] == 0, report["tracing"]

    extra = "    history: [buf]\n"
    (tmp_path / "serve").mkdir()
    with Serve(tmp_path / "serve", target_yaml("buf", lib, str(spec), extra)) as serve:
        runs = [subprocess.Popen([str(prog), str(REQUESTS)], stdout=subprocess.DEVNULL)
                for _ in range(RUNS)]
        assert [p.wait(timeout=60) for p in runs] == [0] * RUNS
        for run in runs:
            serve.wait_log(f"target=buf pid={run.pid} ", 30)
        assert serve.stop() == 0, serve.log
    reports = [json.loads(p.read_text()) for p in sorted(serve.reports.glob("*.json"))]
    processes = [p for r in reports for p in r["processes"]]
    assert len(processes) == RUNS
    for process in processes:
        assert_whole(process)
