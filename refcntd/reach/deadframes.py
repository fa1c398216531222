"""Lost blocks a register may hold: what a live scan must not call lost.

A live scan (GET /leaks) stops the process with SIGSTOP and reads no register but a
blocked system call's arguments.  A thread stopped while running (not in a system
call: mid-code, or at one of refcntd's own uprobes, whose trap is where the pending
SIGSTOP is taken) keeps every register out of sight, and the objects it is working on
now are often held there only: issue 58's healthy gst-launch-1.0 had a GstBuffer just
made "definitely lost" in 3 of 20 scans; in the one looked into, its streaming thread
had stopped at the `ret` after the probe in gst_mini_object_init (the buffer in rdi),
and the buffer's address lay 744 bytes below its stack pointer, in the frames it had
just left, and nowhere else.

Those frames tie the object to the thread: a value a function computed or received
is spilled into its frame more often than not, and the frame stays below the stack
pointer until the thread calls as deep again.  So for each thread stopped while
running, the DEAD_WINDOW bytes below its red zone are read, and a lost block they
point into, with every lost block it reaches, is "not judged": reachable if the
thread's registers hold what its dead frames do, lost if not, and no live scan can
tell.  Threads blocked in a system call are not read so: their callee-saved registers
are out of sight too, but their dead frames are those of calls long returned, and
issue 58's python3 leaker, asleep, had there the last of its 30 lost caps (one
object kept in a register there is still called lost).  Exit scans, where valgrind's
verdicts are compared, read no dead frames.
"""

from __future__ import annotations

import numpy as np

from refcntd.reach import graph
from refcntd.reach.memory import Mapping, ProcessMemory
from refcntd.reach.roots import Thread
from refcntd.reach.stackframes import RED_ZONE

DEAD_WINDOW = 4096  # bytes below a thread's red zone read as the frames it just left

DeadFrames = list[tuple[str, np.ndarray]]  # (thread "TID (comm)", the words)


def low(m: Mapping, sp: int) -> int:
    """The lowest address of `sp`'s stack mapping `m` a live scan reads."""
    return max(m.start, sp - RED_ZONE - DEAD_WINDOW)


def read(mem: ProcessMemory, maps: list[Mapping], threads: list[Thread]) -> DeadFrames:
    """The words below the red zone of each thread stopped while running (copies: the
    memory they come from may be a live copy, dropped after the read)."""
    out = []
    for t in threads:
        if t.syscall != -1:
            continue
        m = next((m for m in maps if t.sp is not None and m.start <= t.sp < m.end), None)
        if m is None or t.sp is None:
            continue
        start, end = low(m, t.sp) & ~7, (t.sp - RED_ZONE) & ~7
        if end > start:
            out.append((f"{t.tid} ({t.comm})", mem.words_at(start, end - start).copy()))
    return out


def maybe_held(dead: DeadFrames, starts: np.ndarray, ends: np.ndarray, kinds: graph.Kinds,
               edges: graph.Edges) -> dict[int, str]:
    """Per lost block a register may hold (its index): the thread whose dead frames
    point into it, or into a lost block that reaches it."""
    lost = (kinds.state == graph.UNREACHED) | (kinds.state == graph.INDIRECT)
    if not dead or not lost.any():
        return {}
    found: dict[int, str] = {}
    for owner, words in dead:
        block = np.searchsorted(starts, words, "right").astype(np.int64) - 1
        inside = (block >= 0) & (words < ends[np.maximum(block, 0)])
        for b in np.unique(block[inside]).tolist():
            if lost[b]:
                found.setdefault(b, owner)
    return _spread(found, lost, edges) if found else found


def _spread(found: dict[int, str], lost: np.ndarray, edges: graph.Edges) -> dict[int, str]:
    """`found` and the lost blocks they reach, each under the thread that reaches it."""
    keep = edges.src >= 0
    src, dst = edges.src[keep], edges.dst[keep]
    keep = lost[src] & lost[dst]
    order = np.argsort(src[keep], kind="stable")
    src, dst = src[keep][order], dst[keep][order]
    ptr = np.concatenate(([0], np.cumsum(np.bincount(src, minlength=len(lost))))).tolist()
    to, stack = dst.tolist(), list(found)
    while stack:
        b = stack.pop()
        for d in to[ptr[b]:ptr[b + 1]]:
            if d not in found:
                found[d] = found[b]
                stack.append(d)
    return found
