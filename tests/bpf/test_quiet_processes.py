"""`run -- ./check.sh`: the script's helpers get one SUMMARY line, not a report each
(issue 41: every `dirname`, `sh` and `id` printed "no leaks in process ..." into a
`make check` log)."""

from __future__ import annotations

import re

from conftest import FIXTURES, refcntd


def test_processes_without_anything_are_summed_up_once(bpf, build, tmp_path):
    exe = build.program("inlinedhelper", [FIXTURES / "inlinedhelper.c"], "O2",
                        flags=["-fomit-frame-pointer", "-Wall", "-Werror"])
    script = tmp_path / "check.sh"
    script.write_text(f'#!/bin/sh\nd=$(dirname "{exe}")\nid -u > /dev/null\n'
                      f'"$d/{exe.name}"\n/bin/true\n')
    script.chmod(0o755)
    result = refcntd(["run", "--", str(script)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    processes = result.report["processes"]
    quiet = [p for p in processes if not p["groups"]]
    assert len(quiet) >= 3 and len(processes) == len(quiet) + 1  # all in the JSON
    text = result.stderr
    assert "no leaks in process" not in text
    (line,) = [x for x in text.splitlines() if "no leaks" in x]
    assert line.startswith(f"SUMMARY: refcntd: no leaks in {len(quiet)} processes: ")
    assert sorted(re.findall(r"\((\d+)\)", line)) == sorted(str(p["pid"]) for p in quiet)
    assert text.count("===") == 2  # one report: the leaking program's
    assert "SUMMARY: refcntd: 1 object of 1 type leaked in process" in text
