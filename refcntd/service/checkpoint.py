"""Checkpoints and diffs: "what is growing?" in processes that never exit.

A checkpoint is a moment (the kernel's monotonic clock, which stamps every
object's init), given to each tracer's kernel side.  From then on the kernel
counts, per process and allocation site, the objects created since that are
still live, with their mean creation time; a diff reads those counts: O(sites),
whatever the number of objects, and nothing per object on the traced side
beyond the counters its init and release update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from refcntd.analysis.leaks import group_sites
from refcntd.analysis.model import ProcessSites
from refcntd.kernel.abi import Stat
from refcntd.kernel.records import SiteLive
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.tracer import Tracer


@dataclass(frozen=True)
class Checkpoint:
    at_ns: int  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
    wall: float  # time.time() of the same moment, for people


def now() -> Checkpoint:
    return Checkpoint(time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time())


def apply(tracer: Tracer, cp: Checkpoint) -> None:
    """The tracer's kernel counts objects created from `cp` on."""
    tracer.kernel.set_checkpoint(cp.at_ns)


def diff(tracer: Tracer, since: Checkpoint) -> list[ProcessSites]:
    """Per process, the live objects created since `since`, grouped by (type, stack);
    built on the tracer's report worker, the one thread that uses its symbolizer."""
    del since  # the kernel holds the checkpoint (apply); the argument says which one
    return tracer.worker.call(lambda: _sites(tracer, True))


def live(tracer: Tracer) -> list[ProcessSites]:
    """Per process, every live object by allocation site (GET /live)."""
    return tracer.worker.call(lambda: _sites(tracer, False))


def sites_lost(tracer: Tracer) -> int:
    """Objects the kernel could not count per site (its site table was full)."""
    return tracer.kernel.stats().get(Stat.ALLOC_SITES_FULL, 0)


def _sites(tracer: Tracer, since: bool) -> list[ProcessSites]:
    by_pid: dict[int, list[SiteLive]] = {}
    for site in tracer.kernel.site_lives():
        by_pid.setdefault(site.tgid, []).append(site)
    tracker, now_ns = tracer.tracker, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for pid, sites in sorted(by_pid.items()):
        groups = group_sites(sites, tracker.stacks, tracker.sym, now_ns, since)
        if not groups:
            continue
        command = read_cmdline(pid)
        session = tracker.sessions.get(pid)
        comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
        out.append(ProcessSites(pid, comm, command, groups))
    return out
