"""The soak's checker: a pid that comes back before its first process is checked."""

from __future__ import annotations

import json
import sys
import threading

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from soakload import Checker, Churn  # noqa: E402


def test_a_reused_pid_is_checked_against_each_process_in_turn(tmp_path):
    """pid_max is 32768 on this machine and an hour launches 58 000 processes: the
    fourth hour's one "wrong" report was a leaking process checked against the truth
    of the process given its pid next (a dict of one truth per pid).  A report read
    before its process's truth was recorded (serve's exit hold writes it sooner) is
    checked at a later scan, and unexpected only while no truth comes for it."""
    churn = Churn.__new__(Churn)  # its truths only: no pacing thread, nothing launched
    churn.truth, churn.lock = {("genlib", 15953): [{"conn": [2]}, {}]}, threading.Lock()
    checker = Checker(tmp_path, churn)
    process = {"pid": 15953, "state": "exited", "groups": []}
    leaking = {**process, "groups": [{"type": "conn", "instances": [{"count": 2}]}]}
    tracing = {"complete": True, "lost": {}}

    def report(n: int, proc: dict) -> None:
        (tmp_path / f"2026120{n}-genlib-15953.json").write_text(
            json.dumps({"processes": [proc], "tracing": tracing}))
    report(1, leaking)
    checker.scan()
    assert checker.missing() == ["genlib 15953"]
    report(2, process)
    checker.scan()
    assert (checker.exact, checker.wrong, checker.unexpected) == (2, [], [])
    assert checker.missing() == []
    report(3, process)  # its truth not recorded yet
    checker.scan()
    assert checker.unexpected == ["genlib 15953 exited"] and checker.exact == 2
    churn.truth[("genlib", 15953)] = [{}]  # the churn thread records it now
    checker.scan()
    assert (checker.exact, checker.unexpected, checker.missing()) == (3, [], [])
