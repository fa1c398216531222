"""Inlined frames are frames everywhere (issue 41), on real BPF.

inlinedhelper.c built -O2 -g -fomit-frame-pointer: `check_name`, a static
helper gcc inlines into `process`, itself inlined into `main`, gets a name and
forgets its put on an early return.  The stacks' only real frame is main's; the
report must still name check_name, a missing put, at the line where it skips
the put (the early return's branch), in the text, the JSON and SARIF, and
`leak:check_name` must suppress it.  (Before: "extra get in main" at the call of process, and the
suppression reported unused.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import FIXTURES, ROOT, marked_line, refcntd

SOURCE = FIXTURES / "inlinedhelper.c"
URI = SOURCE.relative_to(ROOT).as_posix()


def marked(name: str) -> int:
    return marked_line(SOURCE, name)


def program(build) -> Path:
    exe = build.program("inlinedhelper", [SOURCE], "O2",
                        flags=["-fomit-frame-pointer", "-Wall", "-Werror"])
    symbols = subprocess.run(["nm", str(exe)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert "check_name" not in symbols and "process" not in symbols  # both inlined
    return exe


def test_inlined_helper_named_with_its_early_return(bpf, build, tmp_path):
    sarif_path = tmp_path / "out.sarif"
    result = refcntd(["run", "--history", "--sarif", str(sarif_path), "--source-root",
                      str(ROOT), "--", str(program(build))], tmp_path / "run.json")
    assert result.returncode == 23, result.stderr
    early, got = marked("early-return"), marked("get")
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    top = group["culprits"][0]
    assert (top["kind"], top["function"]) == ("missing put", "check_name")
    assert (Path(top["exit_file"]), top["exit_line"]) == (SOURCE, early)
    assert [e["line"] for e in top["exits"]] == [early]
    assert (top["line"], top["put_line"]) == (got, marked("put"))
    assert group["verdict"]["status"] == "culprit"
    # the inlined frames are in the culprit's path and the get's, marked, each with its
    # line in its own code
    assert [f["function"] for f in top["stack"]] == ["name_get", "check_name"]
    (get,) = [h for h in group["instances"][0]["history"] if h["op"] == "get"]
    path = [(f.get("function"), f.get("line"), f.get("inlined", False)) for f in get["stack"]]
    assert ("check_name", got, True) in path
    assert ("process", marked("process-call"), True) in path
    assert ("main", marked("main-call"), False) in path
    text = result.stdout + result.stderr
    assert f"missing put in check_name (inlinedhelper.c:{early})" in text
    assert f"check_name skips its put at inlinedhelper.c:{early}" in text
    assert "< check_name < process < main" in text
    assert "extra get in main" not in text
    (found,) = json.loads(sarif_path.read_text())["runs"][0]["results"]
    (loc,) = found["locations"]
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == URI
    assert loc["physicalLocation"]["region"]["startLine"] == early


def test_leak_check_name_suppresses_it(bpf, build, tmp_path):
    rules = tmp_path / "supp.txt"
    rules.write_text("leak:check_name\n")
    result = refcntd(["run", "--history", "--suppressions", str(rules), "--",
                      str(program(build))], tmp_path / "run.json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unused" not in result.stderr
    assert "0 failing finding(s), 1 suppressed" in result.stderr
    assert "suppressed by leak:check_name" in result.stderr
