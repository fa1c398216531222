"""Independent truth: plain ftrace uprobe events through tracefs, no BPF.

Tests define uprobe events on the same sites refcntd probes and read the
kernel's own trace of them from a private tracefs instance, so a count
refcntd gets wrong cannot also be wrong here in the same way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
LINE = re.compile(r"-(?P<pid>\d+) +\[\d+\].*? (?P<event>\w+): \(0x[0-9a-f]+\) "
                  r"obj=(?P<obj>0x[0-9a-f]+)")


@dataclass(frozen=True)
class UprobeEvent:
    name: str
    path: str
    file_offset: int
    fetch: str  # e.g. "%bx" or "+24(%ax)"
    ref_ctr_offset: int = 0


@contextmanager
def traced(events: list[UprobeEvent]) -> Iterator[list[tuple[int, str, int]]]:
    """Yield a list that is filled, on exit, with (pid, event, object) in kernel order."""
    group = f"refcntd_test_{os.getpid()}"
    instance = TRACEFS / "instances" / group
    defs = TRACEFS / "uprobe_events"
    out: list[tuple[int, str, int]] = []
    for ev in events:
        ref = f"({ev.ref_ctr_offset:#x})" if ev.ref_ctr_offset else ""
        _append(defs, f"p:{group}/{ev.name} {ev.path}:{ev.file_offset:#x}{ref} "
                      f"obj={ev.fetch}:x64")
    instance.mkdir()
    try:
        (instance / "buffer_size_kb").write_text("8192")
        (instance / "events" / group / "enable").write_text("1")
        yield out
        (instance / "events" / group / "enable").write_text("0")
        for line in (instance / "trace").read_text().splitlines():
            if (m := LINE.search(line)) is not None:
                out.append((int(m.group("pid")), m.group("event"), int(m.group("obj"), 16)))
    finally:
        instance.rmdir()
        for ev in events:
            _append(defs, f"-:{group}/{ev.name}")


def _append(path: Path, line: str) -> None:
    """tracefs definition files take appends, not the seek Python's "a" mode does."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def live_at_end(trace: list[tuple[int, str, int]], pid: int, new: str, gone: str) -> set[int]:
    """Objects of `pid` created and not yet destroyed when the trace ends."""
    live: set[int] = set()
    for event, obj in ((e, o) for p, e, o in trace if p == pid):
        if event == new:
            live.add(obj)
        elif event == gone:
            live.discard(obj)
    return live
