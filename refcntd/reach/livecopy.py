"""A copy of a process's memory, so that a live scan stops it only while it is copied.

GET /leaks used to keep the process stopped while its chunks were walked and its words
filtered (0.4-3.1 s for 1 GiB of 64-byte blocks).  Here the stop is a copy: the
writable mappings the scan reads (heaps, modules' data, other writable mappings, each
thread's stack from the page of the frames it just left up: deadframes.py) go into one buffer with
process_vm_readv, the process is continued, and the scan reads the copy
(ProcessMemory.detached): the same bytes, so the same blocks and kinds.

* **Bound**: the copy is at most `bound(limit)`: `limit` (LIMIT unless the caller says)
  and half of the host's MemAvailable.  A process whose writable memory is over it is
  scanned while stopped, as before (leakscan.py says so in its answer).
* **Memory**: one byte per byte copied, for the scan's walk and filter (it is dropped
  before the pointer graph is made, whose arrays are as before).  Its pages are faulted
  in before the stop (`prepare`): a fresh buffer took 4x longer to fill in the stop.
* **Soft-dirty pages** (kernel feature `soft_dirty`, CONFIG_MEM_SOFT_DIRTY: Debian's
  kernels, not this machine's 6.18): as CRIU's iterative pre-dump, `prepare` clears the
  process's soft-dirty bits (/proc/PID/clear_refs, 4) and copies while it runs; in the
  stop `take` reads pagemap and copies again only the pages written since (bit 55), the
  pages of mappings new since (the kernel marks a new or grown mapping soft-dirty
  whole), and none of the rest.  A page released since (MADV_DONTNEED: no write) that
  is neither present nor swapped, or maps the zero page (read since), is zero in an
  anonymous mapping and copied again in a file's (kernel/pagemap.py).  A
  written 4 KiB of a transparent huge page counts its 2 MiB.  The clear makes the
  process's next write to each page a minor fault (write-protection), and another
  soft-dirty user (CRIU) on the same process would lose its own bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refcntd.kernel import pagemap
from refcntd.reach import deadframes
from refcntd.reach.memory import IOV_MAX, Mapping, ProcessMemory, read_maps
from refcntd.reach.roots import SKIPPED, Thread, read_threads, stack_mappings

LIMIT = 4 << 30  # the copy's bound unless the caller gives one (bytes)
AVAILABLE_SHARE = 0.5  # ... and at most this share of MemAvailable
PAGE = 4096
SLACK = 1 / 64  # the buffer's room for memory mapped between `prepare` and the stop

Span = tuple[Mapping, int, int]  # (mapping, start, end): a part of it to copy


@dataclass
class Prepared:
    """Made before the stop: the buffer, its pages faulted in, and with soft-dirty pages
    the copy made while the process ran (in `mem`)."""

    pid: int
    proc: Path
    bound: int
    mem: ProcessMemory
    buffer: np.ndarray
    soft_dirty: bool = False
    notes: list[str] = field(default_factory=list)
    used: int = 0  # bytes of `buffer` the copy made while the process ran took
    pagemap_scan: bool = False  # the stop asks pagemap with the ioctl (kernel/pagemap.py)
    recopied: int = 0  # bytes copied again (or first) in the stop: soft-dirty pages


def bound(limit: int, proc: Path = Path("/proc")) -> int:
    """The copy's bound: `limit`, and no more than AVAILABLE_SHARE of MemAvailable."""
    try:
        with open(f"{proc}/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return min(limit, int(int(line.split()[1]) * 1024 * AVAILABLE_SHARE))
    except (OSError, ValueError, IndexError):
        pass
    return limit


def copy_spans(maps: list[Mapping], threads: list[Thread]) -> list[Span]:
    """What a scan may read, in address order: every writable mapping but the stacks,
    which from their lowest thread's stack pointer (less the red zone and the frames
    it just left, deadframes.py; roots.py scans no lower) up, and not at all when no
    thread is on them (glibc's cache of exited threads' stacks), unless a thread's
    stack pointer is unknown."""
    stacks = stack_mappings(maps)
    unknown = any(t.sp is None for t in threads)
    lows: dict[int, int] = {}
    for t in threads:
        m = next((m for m in maps if t.sp is not None and m.start <= t.sp < m.end), None)
        if m is not None and t.sp is not None:
            lows[m.start] = min(lows.get(m.start, m.end), deadframes.low(m, t.sp))
    out = []
    for m in maps:
        if not m.writable or m.path in SKIPPED:
            continue
        stack = m.start in stacks or m.path == "[stack]"
        if stack and m.start in lows:
            out.append((m, lows[m.start] & ~(PAGE - 1), m.end))
        elif not stack or unknown:
            out.append((m, m.start, m.end))
    return out


def copy_size(pid: int, proc: Path = Path("/proc")) -> int:
    """The bytes a copy of `pid` would take now."""
    maps = read_maps(pid, proc)
    return sum(end - start for _, start, end in copy_spans(maps, read_threads(pid, proc)))


def prepare(pid: int, limit: int = LIMIT, soft_dirty: bool = False,
            proc: Path = Path("/proc"), pagemap_scan: bool = False) -> Prepared | str:
    """Before the stop: the buffer for the process's writable memory, or why not (over
    the bound).  `soft_dirty`: clear the process's bits and copy it while it runs;
    `pagemap_scan`: the kernel has PAGEMAP_SCAN for the stop's question."""
    maps = read_maps(pid, proc)
    spans = copy_spans(maps, read_threads(pid, proc))
    size, most = sum(end - start for _, start, end in spans), bound(limit, proc)
    if not maps:
        return "gone"
    if size > most:
        return (f"{size / 2**30:.2f} GiB of writable memory is over the copy's bound of "
                f"{most / 2**30:.2f} GiB")
    buffer = np.empty(int(size * (1 + SLACK)) + IOV_MAX * PAGE, np.uint8)
    buffer[::PAGE] = 0  # faulted in now, not in the stop
    out = Prepared(pid, proc, most, ProcessMemory(pid, proc), buffer,
                   pagemap_scan=pagemap_scan)
    why = _clear_soft_dirty(pid, proc) if soft_dirty else None
    if soft_dirty and why is None and not pagemap_scan and pagemap.zero_pfn() is None:
        why = ("without PAGEMAP_SCAN a page released and read since is told by the zero "
               "page's frame number, which pagemap hides without CAP_SYS_ADMIN")
    if soft_dirty and why is None:
        out.soft_dirty = True
        out.mem.copy([(start, end) for _, start, end in spans], buffer)
        out.used = size
    elif why:
        out.notes.append(f"soft-dirty pages not cleared ({why}): the memory copied in the stop")
    return out


def _clear_soft_dirty(pid: int, proc: Path) -> str | None:
    """None once cleared, else why not (the shipped unit has no CAP_DAC_OVERRIDE: the
    file is its owner's to write)."""
    try:
        with open(f"{proc}/{pid}/clear_refs", "w") as f:
            f.write("4")
    except OSError as err:
        return f"{proc}/{pid}/clear_refs: {err.strerror}"
    return None


def take(prep: Prepared, maps: list[Mapping], threads: list[Thread]) -> str | None:
    """In the stop: copy what a scan reads (with soft-dirty pages: only what changed
    since the copy `prepare` made), or say why not (over the bound)."""
    spans = copy_spans(maps, threads)
    size = sum(end - start for _, start, end in spans)
    if size > prep.bound:
        return (f"{size / 2**30:.2f} GiB of writable memory at the stop is over the copy's "
                f"bound of {prep.bound / 2**30:.2f} GiB")
    if prep.soft_dirty:
        _recopy(prep, spans)
        return None
    prep.mem.copy([(start, end) for _, start, end in spans], prep.buffer)
    return None


def _recopy(prep: Prepared, spans: list[Span]) -> None:
    """The pages written since the copy made while the process ran, and the parts of
    `spans` that copy does not have (mapped since, a stack grown down)."""
    fresh: list[tuple[int, int]] = []
    again: list[tuple[int, int]] = []
    fd = os.open(f"{prep.proc}/{prep.pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for m, start, end in spans:
            for a, b, inside in _against(prep.mem.copied(), start, end):
                if not inside:
                    fresh.append((a, b))
                    continue
                again += _changed(prep, fd, m, a, b)
    finally:
        os.close(fd)
    prep.recopied = sum(b - a for a, b in fresh + again)
    prep.mem.recopy(again)
    prep.mem.copy(fresh, prep.buffer[prep.used:])


def _against(copied: list[tuple[int, int]], start: int, end: int
             ) -> list[tuple[int, int, bool]]:
    """[start, end) cut into the parts inside a copied span (True) and outside."""
    out, at = [], start
    for a, b in copied:
        if b <= at or a >= end:
            continue
        if a > at:
            out.append((at, a, False))
        out.append((max(a, at), min(b, end), True))
        at = min(b, end)
    if at < end:
        out.append((at, end, False))
    return out


def _changed(prep: Prepared, fd: int, m: Mapping, start: int, end: int
             ) -> list[tuple[int, int]]:
    """The runs of pages of [start, end) to copy again (kernel/pagemap.py), those that
    read as zeros zeroed in the copy."""
    found = pagemap.changed(fd, start, end, prep.pagemap_scan,
                            bool(m.path) and not m.path.startswith("["))
    if found is None:  # the zero page cannot be told: all of it again
        return [(start, end)]
    again, zeros = found
    view = prep.mem.copied_view(start, end)
    for a, b in zeros:
        if view is not None:
            view[a - start: b - start] = 0
    return again
