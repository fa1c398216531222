"""The pointer graph between heap blocks and the leak kinds it gives, as valgrind's
memcheck computes them (mc_leakcheck.c), with numpy over every aligned word read.

- A word is a pointer to a block when its value falls inside the block's usable
  bytes: at its start (a start pointer) or inside it (an interior pointer).
- still reachable: a chain of pointers from a root.  LeakSanitizer counts interior
  pointers; valgrind calls a block reached only through one "possibly lost", which
  `interior_only` keeps apart.
- Not reachable: valgrind takes the unreached blocks in address order; each one not
  yet reached by an earlier one leads a "clique": every unreached block it reaches
  becomes indirectly lost, and the leader stays definitely lost.  A lost cycle thus
  has one definitely lost block (its lowest) however high its counts are.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from refcntd.reach.memory import ProcessMemory
from refcntd.reach.roots import Root

WINDOW = 1 << 22
UNREACHED, REACHABLE, POSSIBLE, INDIRECT = 0, 1, 2, 3
NO_ROOT = -1
NARROW = 256  # a frontier narrower than this is walked in Python ...
WALK_STEPS = 1 << 16  # ... for this many blocks before numpy takes over again


@dataclass
class Edges:
    """Pointers found: from a block (src >= 0) or a root (src = -1 - root index)."""

    src: np.ndarray
    dst: np.ndarray
    interior: np.ndarray
    where: np.ndarray  # the address of the word holding the pointer


def scan_words(mem: ProcessMemory, starts: np.ndarray, ends: np.ndarray,
               roots: list[Root], regions: list[tuple[int, int]]) -> Edges:
    """Every pointer into a block from the roots and from the blocks themselves."""
    parts = []
    for index, root in enumerate(roots):
        if root.values:
            parts.append(_hits(0, np.array(root.values, np.uint64), starts, ends,
                               np.int64(-1 - index), registers=True))
        for base, words in _windows(mem, root.start, root.end):
            parts.append(_hits(base, words, starts, ends, np.int64(-1 - index)))
    for start, end in regions:
        for base, words in _windows(mem, start, end):
            parts.append(_hits(base, words, starts, ends, None))
    if not parts:
        return Edges(*_nothing())
    return Edges(*(np.concatenate([p[i] for p in parts]) for i in range(4)))


def _windows(mem: ProcessMemory, start: int, end: int) -> Iterator[tuple[int, np.ndarray]]:
    """The aligned words of [start, end), a window at a time (bounded memory)."""
    address = (start + 7) & ~7
    while address + 8 <= end:
        size = min(WINDOW, (end - address) & ~7)
        words = mem.words_at(address, size)
        if not len(words):
            return
        yield address, words
        address += size


def _hits(base: int, words: np.ndarray, starts: np.ndarray, ends: np.ndarray,
          root: np.int64 | None, registers: bool = False) -> tuple[np.ndarray, ...]:
    """The words pointing into a block (the word at `base` first); `root` None: the
    words are inside blocks, and count only inside an in-use one."""
    if len(starts) == 0:
        return _nothing()
    kept = np.flatnonzero((words >= starts[0]) & (words < ends[-1]))  # most: cheap to drop
    words = words[kept]
    where = np.zeros(len(kept), np.uint64) if registers else \
        np.uint64(base) + kept.astype(np.uint64) * np.uint64(8)
    dst = np.searchsorted(starts, words, "right").astype(np.int64) - 1
    inside = (dst >= 0) & (words < ends[np.maximum(dst, 0)])
    if root is None:
        src = np.searchsorted(starts, where, "right").astype(np.int64) - 1
        inside &= (src >= 0) & (where < ends[np.maximum(src, 0)])
        src = src[inside]
    else:
        src = np.full(int(np.count_nonzero(inside)), root, np.int64)
    dst, words, where = dst[inside], words[inside], where[inside]
    return src, dst, words != starts[dst], where


def _nothing() -> tuple[np.ndarray, ...]:
    empty = np.zeros(0, np.int64)
    return empty, empty, np.zeros(0, bool), np.zeros(0, np.uint64)


@dataclass
class Kinds:
    """Per block: its state (UNREACHED is definitely lost once classified), and for a
    reachable one the root it was reached from and the word there."""

    state: np.ndarray
    root: np.ndarray  # root index, NO_ROOT
    root_word: np.ndarray  # address of the root word that starts its chain
    leader: np.ndarray  # an indirectly lost block: the definitely lost one it is lost with


def classify(count: int, edges: Edges) -> Kinds:
    from_root = edges.src < 0
    block_edges = ~from_root
    order = np.argsort(edges.src[block_edges], kind="stable")
    src = edges.src[block_edges][order]
    dst = edges.dst[block_edges][order]
    interior = edges.interior[block_edges][order]
    indptr = np.searchsorted(src, np.arange(count + 1))
    root, word = _reach(count, edges, from_root, indptr, dst, None)
    strict, _ = _reach(count, edges, from_root & ~edges.interior, indptr, dst, ~interior)
    state = np.full(count, UNREACHED, np.int8)
    state[root != NO_ROOT] = POSSIBLE
    state[strict != NO_ROOT] = REACHABLE
    leader = _cliques(state, indptr, dst)
    return Kinds(state, root, word, leader)


def _reach(count: int, edges: Edges, seeds: np.ndarray, indptr: np.ndarray, dst: np.ndarray,
           usable: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Breadth-first from the roots' pointers, each block keeping its first root: numpy
    steps while the frontier is wide, a depth-first walk in Python while it is narrow
    (a linked list would otherwise take one numpy step per element)."""
    root = np.full(count, NO_ROOT, np.int64)
    word = np.zeros(count, np.uint64)
    targets, first = np.unique(edges.dst[seeds], return_index=True)
    root[targets] = -1 - edges.src[seeds][first]
    word[targets] = edges.where[seeds][first]
    frontier = targets
    while len(frontier):
        if len(frontier) < NARROW:
            frontier = _walk(frontier, root, word, indptr, dst, usable)
            continue
        lo, counts = indptr[frontier], indptr[frontier + 1] - indptr[frontier]
        total = int(counts.sum())
        if total == 0:
            break
        index = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(total)
        parents = np.repeat(frontier, counts)
        found = dst[index]
        fresh = root[found] == NO_ROOT
        if usable is not None:
            fresh &= usable[index]
        found, parents = found[fresh], parents[fresh]
        frontier, first = np.unique(found, return_index=True)
        root[frontier] = root[parents[first]]
        word[frontier] = word[parents[first]]
    return root, word


def _walk(frontier: np.ndarray, root: np.ndarray, word: np.ndarray, indptr: np.ndarray,
          dst: np.ndarray, usable: np.ndarray | None) -> np.ndarray:
    """Depth-first from a narrow frontier for up to WALK_STEPS blocks; the blocks found
    but not yet followed (the next frontier).  Through memoryviews: an element is a
    Python int without a numpy scalar in between."""
    stack = frontier.tolist()
    ptr, to, roots, words = (memoryview(a.data) for a in (indptr, dst, root, word))
    ok = memoryview(usable.view(np.uint8).data) if usable is not None else None
    for _ in range(WALK_STEPS):
        if not stack:
            break
        block = stack.pop()
        for i in range(ptr[block], ptr[block + 1]):
            target = to[i]
            if roots[target] == NO_ROOT and (ok is None or ok[i]):
                roots[target], words[target] = roots[block], words[block]
                stack.append(target)
    return np.unique(np.array(stack, np.int64))


def _cliques(state: np.ndarray, indptr: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """valgrind's clique pass over the unreached blocks, in address order; each
    indirectly lost block's leader (the last clique to reach it, as valgrind's)."""
    leaders = np.full(len(state), -1, np.int64)
    for leader in np.flatnonzero(state == UNREACHED).tolist():
        if state[leader] != UNREACHED:
            continue
        stack = [leader]
        while stack:
            block = stack.pop()
            for target in dst[indptr[block]:indptr[block + 1]].tolist():
                if target != leader and state[target] == UNREACHED:
                    state[target] = INDIRECT
                    leaders[target] = leader
                    stack.append(target)
    for block in np.flatnonzero(leaders >= 0).tolist():  # a leader reached later: its own
        while leaders[leaders[block]] >= 0:
            leaders[block] = leaders[leaders[block]]
    return leaders
