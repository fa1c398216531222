"""Checkpoints and diffs: "what is growing?" in processes that never exit.

A checkpoint is a moment (the kernel's monotonic clock, which stamps every
object's init).  A diff lists the objects created since then that are still
live, per process, grouped by (type, allocation stack) like a leak report.
The objects are read from the kernel map on demand (O(live objects) per
diff; no cost on the traced program), symbolized while the process lives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from refcntd.analysis.leaks import group_leaks
from refcntd.analysis.model import ProcessReport
from refcntd.kernel.records import ObjectRecord
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.tracer import Tracer

STATE_SINCE_CHECKPOINT = "live, created since the checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    at_ns: int  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
    wall: float  # time.time() of the same moment, for people


def now() -> Checkpoint:
    return Checkpoint(time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time())


def diff(tracer: Tracer, since: Checkpoint) -> list[ProcessReport]:
    """Per process, the live objects created since `since`, grouped by (type, stack);
    built on the tracer's report worker, the one thread that uses its symbolizer."""
    return tracer.worker.call(lambda: _diff(tracer, since))


def _diff(tracer: Tracer, since: Checkpoint) -> list[ProcessReport]:
    by_pid: dict[int, list[ObjectRecord]] = {}
    for rec in tracer.kernel.live_objects():
        if rec.init_ns >= since.at_ns:
            by_pid.setdefault(rec.tgid, []).append(rec)
    tracker, now_ns = tracer.tracker, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for pid, records in sorted(by_pid.items()):
        groups = group_leaks(records, tracker.stacks, tracker.sym, now_ns)
        command = read_cmdline(pid)
        session = tracker.sessions.get(pid)
        comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
        out.append(ProcessReport(pid, comm, command, STATE_SINCE_CHECKPOINT, groups=groups))
    return out
