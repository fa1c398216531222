"""binary/forked.py: a child's answer comes back; a child never hangs on the progress
reporter's lock that another thread of the parent held at the fork, and draws nothing."""

from __future__ import annotations

import os
import select
import signal

from refcntd import progress
from refcntd.binary.forked import Forked


def _advance_and_say() -> tuple[bool, int]:
    progress.advance(3, 4)  # what the DWARF scan does every 64 units
    return progress.REPORTER.quiet, progress.REPORTER._done


def test_child_answers_though_the_progress_lock_was_held_at_the_fork() -> None:
    progress.configure(verbose=True, quiet=False)
    try:
        with progress.REPORTER._lock:  # as the timer thread holds it while drawing
            child = Forked(_advance_and_say)
        ready, _, _ = select.select([child._pipe], [], [], 20)
        if not ready:  # the child is stuck: do not hang the suite
            os.kill(child._pid, signal.SIGKILL)
        assert child.result() == (True, 3)
        assert not progress.REPORTER.quiet  # the parent still shows progress
    finally:
        progress.configure(verbose=False, quiet=True)


def test_a_failing_child_gives_none() -> None:
    def boom() -> int:
        raise RuntimeError("no")
    assert Forked(boom).result() is None
