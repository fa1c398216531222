"""The soak's checker: a pid that comes back before its first process is checked."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from soakload import Checker, Churn  # noqa: E402


def test_a_reused_pid_is_checked_against_each_process_in_turn():
    """pid_max is 32768 on this machine and an hour launches 58 000 processes: the
    fourth hour's one "wrong" report was a leaking process checked against the truth
    of the process given its pid next (a dict of one truth per pid)."""
    churn = Churn.__new__(Churn)  # its truths only: no pacing thread, nothing launched
    churn.truth, churn.lock = {("genlib", 15953): [{"conn": [2]}, {}]}, threading.Lock()
    checker = Checker(Path("/nonexistent"), churn)
    process = {"pid": 15953, "state": "exited", "groups": []}
    leaking = {**process, "groups": [{"type": "conn", "instances": [{"count": 2}]}]}
    tracing = {"complete": True, "lost": {}}
    checker._check("genlib", {"processes": [leaking], "tracing": tracing})
    assert checker.missing() == ["genlib 15953"]
    checker._check("genlib", {"processes": [process], "tracing": tracing})
    assert (checker.exact, checker.wrong, checker.unexpected) == (2, [], [])
    assert checker.missing() == []
    # a third report of that pid has no truth left: kept for the next scan (its truth may
    # not be recorded yet), not checked against another process's
    assert not checker._check("genlib", {"processes": [process], "tracing": tracing})
    assert (checker.exact, checker.wrong) == (2, [])
