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

from refcntd.reach import glibc, graph
from refcntd.reach.memory import ProcessMemory, read_maps
from refcntd.reach.roots import describe, find_roots, read_threads

REACHABLE = "still reachable"
DEFINITELY = "definitely lost"
INDIRECTLY = "indirectly lost"
KIND_OF_STATE = {graph.REACHABLE: REACHABLE, graph.POSSIBLE: REACHABLE,
                 graph.UNREACHED: DEFINITELY, graph.INDIRECT: INDIRECTLY}


@dataclass(frozen=True)
class ObjectKind:
    kind: str  # REACHABLE, DEFINITELY or INDIRECTLY
    root: str = ""  # for a reachable one: "global cache (prog)", "the stack of thread 2 (x)"
    interior_only: bool = False  # reached only through a pointer inside a block: valgrind
    #                              says "possibly lost" (LeakSanitizer: reachable)
    own_block: bool = True  # the object is its heap block (not inside a larger one)


@dataclass
class ReachScan:
    """`kinds` by object address; `complete` false: no kinds, `notes` say why."""

    pid: int
    kinds: dict[int, ObjectKind] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    complete: bool = True
    blocks: int = 0
    heap_bytes: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    lost_blocks: int = 0  # every unreachable block, tracked or not


def scan_process(pid: int, objects: Iterable[int], proc: Path = Path("/proc")) -> ReachScan:
    """Scan `pid` (stopped by the caller) and give each of `objects` its kind."""
    began = time.monotonic()
    out = ReachScan(pid)
    mem = ProcessMemory(pid, proc)
    try:
        _scan(mem, out, sorted(set(objects)), proc)
    finally:
        mem.close()
    out.bytes_read = mem.bytes_read
    out.seconds = time.monotonic() - began
    return out


def _scan(mem: ProcessMemory, out: ReachScan, objects: list[int], proc: Path) -> None:
    maps = read_maps(out.pid, proc)
    if not maps:
        out.complete = False
        out.notes.append(f"process {out.pid} gone before its memory was scanned")
        return
    heap = glibc.find_heap(mem, maps)
    out.notes += heap.notes
    if not heap.recognised:
        out.complete = False
        return
    threads = read_threads(out.pid, proc)
    roots, notes = find_roots(maps, threads, out.pid, heap.regions)
    out.notes += notes
    edges = graph.scan_words(mem, heap.starts, heap.ends, roots, heap.regions)
    kinds = graph.classify(len(heap.starts), edges)
    out.blocks = len(heap.starts)
    out.heap_bytes = int((heap.ends - heap.starts).sum()) if out.blocks else 0
    out.lost_blocks = int(np.count_nonzero((kinds.state == graph.UNREACHED)
                                           | (kinds.state == graph.INDIRECT)))
    where = np.array(objects, np.uint64)
    block = np.searchsorted(heap.starts, where, "right").astype(np.int64) - 1
    for address, b in zip(objects, block.tolist(), strict=True):
        if b < 0 or address >= int(heap.ends[b]):
            continue
        state = int(kinds.state[b])
        root = ""
        if state in (graph.REACHABLE, graph.POSSIBLE):
            r = roots[int(kinds.root[b])]
            root = describe(r, int(kinds.root_word[b]))
        out.kinds[address] = ObjectKind(KIND_OF_STATE[state], root, state == graph.POSSIBLE,
                                        address == int(heap.starts[b]))
