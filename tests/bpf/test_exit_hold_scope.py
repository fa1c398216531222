"""Which processes `run` holds at libc's _exit for the leak-kinds scan: only those
that have had a tracked object (PROC_HAS_OBJECTS, bpf/exithold.h).  The shell and
the tools around a test have nothing to classify; stopping each of them cost a
stop, a scan and a SIGCHLD(CLD_STOPPED) to its parent for nothing."""

from __future__ import annotations

from conftest import EXAMPLES, FIXTURES, cc, refcntd


def test_only_processes_with_objects_are_held_at_exit(bpf, tmp_path):
    exe = cc(tmp_path / "reach", [FIXTURES / "reach.c", EXAMPLES / "refcnt.c"],
             ["-O2", "-fomit-frame-pointer", "-pthread"])
    script = f"/bin/true; {exe} exit; /bin/true"  # not the last: the shell forks for it
    result = refcntd(["run", "--", "sh", "-c", script], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    processes = result.report["processes"]
    assert len(processes) == 4, [p["comm"] for p in processes]  # sh, true, reach, true
    (reach,) = [p for p in processes if p["groups"]]
    assert len(reach["groups"]) == 14 and all("kind" in g for g in reach["groups"])
    notes = " ".join(result.report["tracing"]["notes"])
    assert "1 process(es) scanned at exit for leak kinds" in notes, notes
