"""One reachability scan of a stopped process: leak kinds for its tracked objects.

The caller stops the process (SIGSTOP, or the exit hold) and continues it; the scan
only reads.  A tracked object belongs to the heap block containing it: its kind is
the block's, comparable with valgrind's when the object is the block itself
(`own_block`).  An object outside every block (static, on a stack, from an allocator
the walker does not know) gets no kind and keeps its verdict.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refcntd.reach import deadframes, glibc, graph, gslice, livecopy, stackframes, stdio
from refcntd.reach.exitframes import ExitPath, walk_exit
from refcntd.reach.memory import Mapping, ProcessMemory, read_maps
from refcntd.reach.roots import Root, Thread, describe, find_roots, read_threads

REACHABLE = "still reachable"
DEFINITELY = "definitely lost"
INDIRECTLY = "indirectly lost"
LATE = "created after the scan"  # by a thread still running once the scan was over
IN_REGISTER = "maybe held in a register"  # live: not judged (deadframes.py)
KIND_OF_STATE = {graph.REACHABLE: REACHABLE, graph.POSSIBLE: REACHABLE,
                 graph.UNREACHED: DEFINITELY, graph.INDIRECT: INDIRECTLY}


@dataclass(frozen=True)
class ObjectKind:
    kind: str  # REACHABLE, DEFINITELY or INDIRECTLY
    root: str = ""  # for a reachable one: "global cache (prog)", "the stack of thread 2 (x)"
    interior_only: bool = False  # reached only through a pointer inside a block: valgrind
    #                              says "possibly lost" (LeakSanitizer: reachable)
    own_block: bool = True  # the object is its heap block (not inside a larger one)
    lost_with: int = 0  # indirectly lost: the definitely lost block holding it (its start)
    block: int = 0  # the start of its block


@dataclass
class ReachScan:
    """Every heap block's kind; `complete` false: no kinds, `notes` say why.  Kept until
    the process's report (its objects are read from the kernel after it is gone)."""

    pid: int
    notes: list[str] = field(default_factory=list)
    complete: bool = True
    heap: glibc.Heap = field(default_factory=glibc.Heap)
    kinds: graph.Kinds | None = None
    roots: list[Root] = field(default_factory=list)
    heap_bytes: int = 0
    bytes_read: int = 0
    reads: int = 0  # system calls that read the process (ProcessMemory.reads)
    seconds: float = 0.0
    taken_ns: int = 0  # CLOCK_MONOTONIC (the kernel's event clock) when reading began
    lost_blocks: int = 0  # every unreachable block, tracked or not
    words: graph.Words | None = None  # read, not yet made kinds (read_process, finish)
    unseen_threads: int = 0  # threads whose callee-saved registers the scan cannot read
    #                          (all but the one held at _exit, whose exit frames saved them)
    edges: graph.Edges | None = None  # made by finish, for the holders (holders.py); the
    #                                   kinds' reader drops them (drop_edges)
    direct_exit: bool = False  # held at `_exit` reached without exit() (exitframes.py)
    classes: dict[int, str] = field(default_factory=dict)  # object -> its class (gtypes.py)
    slabs: gslice.Slabs | None = None  # GLib's slice allocator, read; `finish` cuts them
    dead: deadframes.DeadFrames = field(default_factory=list)  # live: the frames each
    #                                     thread just left, read; `finish` drops them
    maybe_held: dict[int, str] = field(default_factory=dict)  # lost block -> the thread
    #                                     whose registers may hold it (deadframes.py)
    stdio: list[tuple[int, int]] = field(default_factory=list)  # streams' buffers, read;
    #                                     `finish` drops the words in them (stdio.py)

    @property
    def blocks(self) -> int:
        return len(self.heap.starts)

    def kinds_of(self, objects: Iterable[int]) -> dict[int, ObjectKind]:
        """The kind of each object inside a heap block (others have none)."""
        if self.kinds is None or not self.blocks:
            return {}
        addresses = sorted(set(objects))
        where = np.array(addresses, np.uint64)
        index = np.searchsorted(self.heap.starts, where, "right").astype(np.int64) - 1
        out = {}
        for address, b in zip(addresses, index.tolist(), strict=True):
            if b >= 0 and address < int(self.heap.ends[b]):
                out[address] = self._kind(address, b)
        return out

    def block_indices(self, objects: list[int]) -> list[int]:
        """The index of the block holding each object (each inside one)."""
        found = np.searchsorted(self.heap.starts, np.array(objects, np.uint64), "right")
        return [int(b) - 1 for b in found]

    def drop_edges(self) -> None:
        """The pointer graph is read once, for the holders of the objects reported: a
        heap of millions of blocks has as many edges, not to be kept with the scan."""
        self.edges = None

    def freed(self, objects: Iterable[int]) -> list[int]:
        """The objects inside a chunk malloc holds as free (a tcache or a fastbin): their
        memory was released, whatever their records say."""
        where = np.array(sorted(set(objects)), np.uint64)
        index = np.searchsorted(self.heap.freed, where, "right").astype(np.int64) - 1
        inside = (index >= 0) & (where < self.heap.freed_ends[np.maximum(index, 0)]) \
            if len(self.heap.freed) else np.zeros(len(where), bool)
        return where[inside].tolist()  # type: ignore[no-any-return]

    def _kind(self, address: int, block: int) -> ObjectKind:
        assert self.kinds is not None
        if block in self.maybe_held:  # not judged: a register may hold it (deadframes.py)
            return ObjectKind(IN_REGISTER, f"the registers of thread {self.maybe_held[block]}"
                              " (a pointer into its lost blocks lies in the frames it just "
                              "left)", own_block=address == int(self.heap.starts[block]),
                              block=int(self.heap.starts[block]))
        state = int(self.kinds.state[block])
        root = ""
        if state in (graph.REACHABLE, graph.POSSIBLE):
            root = describe(self.roots[int(self.kinds.root[block])],
                            int(self.kinds.root_word[block]))
        leader = int(self.kinds.leader[block])
        return ObjectKind(KIND_OF_STATE[state], root, state == graph.POSSIBLE,
                          address == int(self.heap.starts[block]),
                          int(self.heap.starts[leader]) if leader >= 0 else 0,
                          int(self.heap.starts[block]))


def scan_process(pid: int, proc: Path = Path("/proc"), at_exit: bool = False) -> ReachScan:
    """Scan `pid` (stopped by the caller): the kind of every heap block.  `at_exit`: held
    at `_exit`, whose thread's exit frames are scanned as valgrind does
    (exitframes.py)."""
    out = read_process(pid, proc, at_exit)
    finish(out)
    return out


def read_process(pid: int, proc: Path = Path("/proc"), at_exit: bool = False) -> ReachScan:
    """The part of a scan that needs `pid` stopped: its maps, threads, chunks and the
    words that may point into a block.  `finish` then needs the process no more (the
    caller may continue it): the kinds are those of the moment it was stopped."""
    began = time.monotonic()
    out = ReachScan(pid, taken_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    mem = ProcessMemory(pid, proc)
    try:
        _read(mem, out, proc, at_exit)
    finally:
        mem.close()
    out.bytes_read, out.reads = mem.bytes_read, mem.reads
    out.seconds = time.monotonic() - began
    return out


@dataclass
class Copied:
    """What `copy_process` took while the process was stopped; `read_copy` reads it."""

    out: ReachScan
    prep: livecopy.Prepared
    maps: list[Mapping]
    threads: list[Thread]


def copy_process(prep: livecopy.Prepared) -> Copied | str:
    """While the process is stopped: its maps, threads and a copy of the memory a scan
    reads (livecopy.py), or why not (over the copy's bound: the caller then scans it
    stopped, read_process).  The caller may continue it once this returns."""
    began = time.monotonic()
    out = ReachScan(prep.pid, taken_ns=time.clock_gettime_ns(time.CLOCK_MONOTONIC))
    maps = read_maps(prep.pid, prep.proc)
    threads = read_threads(prep.pid, prep.proc) if maps else []
    why = livecopy.take(prep, maps, threads) if maps else None
    if why is not None:
        prep.mem.close()
        return why
    out.seconds = time.monotonic() - began
    return Copied(out, prep, maps, threads)


def read_copy(copied: Copied) -> ReachScan:
    """The reads of `read_process`, from the copy: the same blocks and words, while the
    process runs on.  `finish` then as after read_process."""
    began, out, mem = time.monotonic(), copied.out, copied.prep.mem
    mem.detached = True
    out.notes += copied.prep.notes
    try:
        if copied.maps:
            _read_from(mem, out, copied.maps, copied.threads, {}, live=True)
        else:
            _gone(out)
    finally:
        mem.close()
        copied.prep.buffer = np.zeros(0, np.uint8)  # the copy's memory goes now
    out.bytes_read, out.reads = mem.bytes_read, mem.reads
    out.seconds += time.monotonic() - began
    return out


def _gone(out: ReachScan) -> None:
    out.complete = False
    out.notes.append(f"process {out.pid} gone before its memory was scanned")


def _read(mem: ProcessMemory, out: ReachScan, proc: Path, at_exit: bool = False) -> None:
    maps = read_maps(out.pid, proc)
    if not maps:
        _gone(out)
        return
    mem.snapshot(maps)
    threads = read_threads(out.pid, proc)
    exiting = _exit_frames(mem, maps, threads, out) if at_exit else {}
    _read_from(mem, out, maps, threads, exiting, live=not at_exit)


def _read_from(mem: ProcessMemory, out: ReachScan, maps: list[Mapping],
               threads: list[Thread], exiting: dict[int, ExitPath], live: bool) -> None:
    out.words = graph.Words()
    out.heap = glibc.read_heap(mem, maps, out.words)
    out.notes += out.heap.notes
    if not out.heap.recognised:
        out.complete = False
        out.words = None
        return
    out.slabs = gslice.read_slabs(mem, maps, out.heap.runs)
    out.unseen_threads = sum(1 for t in threads if t.tid not in exiting)
    if live:
        out.dead = deadframes.read(mem, maps, threads)
    frames = {t.tid: stackframes.walk(mem, maps, t.sp, t.pc) for t in threads
              if t.sp is not None and t.pc}
    out.roots, notes = find_roots(maps, threads, out.pid, out.heap.regions, exiting, frames)
    out.notes += notes
    out.stdio = stdio.read_buffers(mem, out.roots)
    graph.read_words(mem, out.heap.span, out.roots, out.heap.regions, out.heap.covered,
                     out.words)


def _exit_frames(mem: ProcessMemory, maps: list[Mapping], threads: list[Thread],
                 out: ReachScan) -> dict[int, ExitPath]:
    """The exit frames of the thread held at `_exit`, and whether exit() ran: told before
    the heap is read, so a process that skipped it is not judged even when its heap
    cannot be scanned."""
    walks = {t.tid: walk_exit(mem, maps, t.sp, t.pc) for t in threads
             if t.sp is not None and t.pc}
    ran = {w.exit_ran for w in walks.values()}
    out.direct_exit = False in ran and True not in ran
    if out.direct_exit:
        out.notes.append("ended through libc's _exit without exit() (the program's own "
                         "_exit, or quick_exit): no atexit handler ran, so LeakSanitizer "
                         "would check nothing; with --leak-kinds its leaks are reported, "
                         "not judged (--judge-killed judges them)")
    return {tid: w.path for tid, w in walks.items() if w.path is not None}


def finish(out: ReachScan) -> None:
    """The blocks, the pointer graph and the kinds, from what `read_process` read (then
    dropped)."""
    if out.words is None:
        if out.heap.runs:
            glibc.settle(out.heap)
        return
    began = time.monotonic()
    glibc.settle(out.heap)
    gslice.split(out.heap, out.slabs, out.words)
    if out.slabs is not None:
        out.notes += out.slabs.notes
    starts, ends = out.heap.starts, out.heap.ends
    stdio.drop_words(out.words, out.stdio, starts, out.heap.tails)
    edges = graph.find_edges(out.words, starts, ends, out.heap.tails)
    out.words = None
    out.kinds = graph.classify(len(starts), edges)
    out.edges = edges
    out.maybe_held = deadframes.maybe_held(out.dead, starts, ends, out.kinds, edges)
    out.dead = []
    out.heap_bytes = int((ends - starts).sum()) if len(starts) else 0
    out.lost_blocks = int(np.count_nonzero((out.kinds.state == graph.UNREACHED)
                                           | (out.kinds.state == graph.INDIRECT)))
    out.seconds += time.monotonic() - began
