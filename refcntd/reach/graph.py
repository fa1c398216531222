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

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from refcntd.reach import chunks
from refcntd.reach.memory import ProcessMemory
from refcntd.reach.paths import find_paths
from refcntd.reach.roots import Root

WINDOW = 1 << 22
BLOCK_MIN, BLOCK_MAX = 1 << 16, 1 << 21  # entries of Words's blocks (8 bytes each, twice)
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
    value: np.ndarray  # the pointer itself (where in its block it points: holders.py)


@dataclass
class Words:
    """The words read while the process was stopped that may point into a block (their
    value inside the blocks' span), each with where it was (0: a register) and whose
    it was (a root's index, or None: the heap's): all the pointer graph needs, so the
    edges are found after the process is continued.  One entry per such word: no more
    than the edges themselves take (most words of a heap are no pointer into it)."""

    values: list[np.ndarray] = field(default_factory=list)
    where: list[np.ndarray] = field(default_factory=list)
    owner: list[int | None] = field(default_factory=list)
    _block: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.uint64), np.zeros(0, np.uint64))
    _used: int = 0

    def add(self, values: np.ndarray, where: np.ndarray, owner: int | None) -> None:
        self.values.append(values)
        self.where.append(where)
        self.owner.append(owner)

    def room(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Space for `count` more entries, written in place (`taken` then keeps them):
        blocks each twice the last (from BLOCK_MIN up to BLOCK_MAX entries), large
        enough for numpy to ask for huge pages, instead of a small copy per window,
        which faulted in page after page while the process was stopped."""
        if len(self._block[0]) - self._used < count:
            size = max(count, min(BLOCK_MAX, max(BLOCK_MIN, 2 * len(self._block[0]))))
            self._block, self._used = (np.empty(size, np.uint64),
                                       np.empty(size, np.uint64)), 0
        return self._block[0][self._used:], self._block[1][self._used:]

    def taken(self, count: int, owner: int | None) -> None:
        at = self._used
        self.add(self._block[0][at:at + count], self._block[1][at:at + count], owner)
        self._used += count

    def extend(self, other: Words) -> None:
        self.values += other.values
        self.where += other.where
        self.owner += other.owner


def read_words(mem: ProcessMemory, span: tuple[int, int], roots: list[Root],
               regions: list[tuple[int, int]],
               covered: dict[tuple[int, int], tuple[int, int]] | None = None,
               out: Words | None = None) -> Words:
    """While the process is stopped: every word of the roots and of the heap whose value
    falls in `span` (from the first block's start to the last one's end, or wider), into
    `out`, which may hold those of the parts of regions `covered` already."""
    out = Words() if out is None else out
    if span[0] >= span[1]:
        return out
    lo, hi = np.uint64(span[0]), np.uint64(span[1])
    keep = PointerFilter(lo, hi)
    for index, root in enumerate(roots):
        if root.values:
            values = np.array(root.values, np.uint64)
            kept = values[(values >= lo) & (values < hi)]
            out.add(kept, np.zeros(len(kept), np.uint64), index)
        for base, words in _windows(mem, root.start, root.end):
            keep.add_to(out, base, words, index)
    for start, end in _uncovered(regions, covered or {}):
        for base, words in _windows(mem, start, end):
            keep.add_to(out, base, words, None)
    return out


def _uncovered(regions: list[tuple[int, int]],
               covered: dict[tuple[int, int], tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Each region, less the part of it already read (one part at most)."""
    for start, end in regions:
        lo, hi = covered.get((start, end), (end, end))
        yield from ((a, b) for a, b in ((start, lo), (hi, end)) if a < b)


class PointerFilter:
    """_candidates, in one compiled pass where chunkwalk.c is built (numpy's takes
    several over each window, a quarter of the stop on a heap of small blocks),
    written straight into the Words kept."""

    def __init__(self, lo: int | np.uint64, hi: int | np.uint64) -> None:
        self.lo, self.hi, self.lib = np.uint64(lo), np.uint64(hi), chunks.compiled()

    def add_to(self, out: Words, base: int, words: np.ndarray, owner: int | None) -> None:
        if self.lib is None:
            out.add(*_candidates(base, words, self.lo, self.hi), owner)
            return
        values, where = out.room(len(words))
        count = self.lib.refcntd_pointers(words, len(words), base, self.lo, self.hi, values,
                                          where)
        out.taken(count, owner)

    def into(self, out: Words) -> Callable[[int, np.ndarray], None]:
        """A walk's sink: the heap's words kept in `out`."""
        return lambda base, words: self.add_to(out, base, words, None)


def find_edges(words: Words, starts: np.ndarray, ends: np.ndarray,
               tails: np.ndarray | None = None) -> Edges:
    """Every pointer into a block from the blocks themselves (a block holds the words
    up to its tail, glibc.Heap; its end without tails), then from the roots, each in
    the order read.  Resolved in two passes, not one per part: a short-lived
    process's scan has a dozen small parts, and numpy's fixed cost per call was most
    of its kinds."""
    heap = [i for i, owner in enumerate(words.owner) if owner is None]
    rooted = {i: -1 - owner for i, owner in enumerate(words.owner) if owner is not None}
    parts = []
    if heap:
        parts.append(_resolve(_joined(words.values, heap), _joined(words.where, heap),
                              starts, ends, None, tails))
    if rooted:
        owners = np.repeat(np.array(list(rooted.values()), np.int64),
                           [len(words.values[i]) for i in rooted])
        parts.append(_resolve(_joined(words.values, list(rooted)),
                              _joined(words.where, list(rooted)), starts, ends, owners, tails))
    if not parts:
        return Edges(*_nothing())
    return Edges(*(np.concatenate([p[i] for p in parts]) for i in range(5)))


def _joined(arrays: list[np.ndarray], which: list[int]) -> np.ndarray:
    return np.concatenate([arrays[i] for i in which]).astype(np.uint64, copy=False)


def _windows(mem: ProcessMemory, start: int, end: int) -> Iterator[tuple[int, np.ndarray]]:
    """The aligned words of [start, end), a window at a time (bounded memory)."""
    address = (start + 7) & ~7
    while address + 8 <= end:
        size = min(WINDOW, (end - address) & ~7)
        words = mem.words_at(address, size, reuse=True)
        if not len(words):
            return
        yield address, words
        address += size


def _candidates(base: int, words: np.ndarray, lo: np.uint64, hi: np.uint64
                ) -> tuple[np.ndarray, np.ndarray]:
    """The words in [lo, hi) (most are not: cheap to drop) and their addresses."""
    kept = np.flatnonzero((words >= lo) & (words < hi))
    return words[kept], np.uint64(base) + kept.astype(np.uint64) * np.uint64(8)


def _hits(base: int, words: np.ndarray, starts: np.ndarray, ends: np.ndarray,
          root: np.int64 | None, tails: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """The words at `base` pointing into a block (read and resolved at once)."""
    if len(starts) == 0:
        return _nothing()
    return _resolve(*_candidates(base, words, starts[0], ends[-1]), starts, ends, root, tails)


def _resolve(words: np.ndarray, where: np.ndarray, starts: np.ndarray, ends: np.ndarray,
             root: np.int64 | np.ndarray | None, tails: np.ndarray | None = None
             ) -> tuple[np.ndarray, ...]:
    """The words pointing into a block; `root` None: the words are inside blocks, and
    count only inside an in-use one (before its tail); else the root (-1 - its index)
    of all the words, or of each."""
    if len(starts) == 0:
        return _nothing()
    dst = np.searchsorted(starts, words, "right").astype(np.int64) - 1
    inside = (dst >= 0) & (words < ends[np.maximum(dst, 0)])
    if root is None:
        src = np.searchsorted(starts, where, "right").astype(np.int64) - 1
        held_to = ends if tails is None else tails
        inside &= (src >= 0) & (where < held_to[np.maximum(src, 0)])
        src = src[inside]
    else:
        src = root[inside] if isinstance(root, np.ndarray) else \
            np.full(int(np.count_nonzero(inside)), root, np.int64)
    dst, words, where = dst[inside], words[inside], where[inside]
    return src, dst, words != starts[dst], where, words


def _nothing() -> tuple[np.ndarray, ...]:
    empty = np.zeros(0, np.int64)
    return empty, empty, np.zeros(0, bool), np.zeros(0, np.uint64), np.zeros(0, np.uint64)


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
    src, dst, interior = (a[~from_root] for a in (edges.src, edges.dst, edges.interior))
    if len(src) > 1 and not bool((src[1:] >= src[:-1]).all()):
        order = np.argsort(src, kind="stable")
        src, dst, interior = src[order], dst[order], interior[order]
    loose = _Graph(count, src, dst)
    root, word = _reach(count, edges, from_root, loose)
    state = np.full(count, UNREACHED, np.int8)
    state[root != NO_ROOT] = REACHABLE
    if edges.interior.any():  # else every chain is one of start pointers: all reachable
        strict = loose if not interior.any() else _Graph(count, src[~interior],
                                                         dst[~interior])
        strict.reached_from = strict.paths.end.copy()
        by_starts, _ = _reach(count, edges, from_root & ~edges.interior, strict)
        state[(root != NO_ROOT) & (by_starts == NO_ROOT)] = POSSIBLE
    leader = _cliques(state, loose.indptr, dst, src)
    return Kinds(state, root, word, leader)


def _indptr(count: int, src: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(np.bincount(src, minlength=count))))


class _Graph:
    """Block-to-block pointers by source (CSR) and the graph's linked paths."""

    def __init__(self, count: int, src: np.ndarray, dst: np.ndarray) -> None:
        self.indptr, self.dst = _indptr(count, src), dst
        self.paths = find_paths(count, self.indptr, dst)
        self.reached_from = self.paths.end.copy()  # per path: the first place reached

    def close(self, frontier: np.ndarray, root: np.ndarray, word: np.ndarray) -> np.ndarray:
        """The frontier and, for each path it touches, the rest of that path after its
        earliest block in the frontier (marked with that block's root)."""
        on = frontier[self.paths.path[frontier] >= 0]
        if not len(on):
            return frontier
        path, pos = self.paths.path[on], self.paths.pos[on]
        order = np.lexsort((pos, path))
        first = np.unique(path[order], return_index=True)[1]
        path, lo = path[order][first], pos[order][first]
        hi = self.reached_from[path]
        more = lo < hi
        path, lo, hi = path[more], lo[more], hi[more]
        self.reached_from[path] = lo
        counts = hi - lo
        places = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        blocks = self.paths.order[places]
        starts = np.repeat(self.paths.order[lo], counts)
        fresh = root[blocks] == NO_ROOT
        blocks, starts = blocks[fresh], starts[fresh]
        root[blocks], word[blocks] = root[starts], word[starts]
        return np.concatenate((frontier, blocks))

    def expand(self, frontier: np.ndarray, root: np.ndarray, word: np.ndarray) -> np.ndarray:
        """One breadth-first step: the blocks first reached from the frontier."""
        lo, counts = self.indptr[frontier], self.indptr[frontier + 1] - self.indptr[frontier]
        total = int(counts.sum())
        index = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(total)
        parents = np.repeat(frontier, counts)
        found = self.dst[index]
        fresh = root[found] == NO_ROOT
        found, parents = found[fresh], parents[fresh]
        found, first = np.unique(found, return_index=True)
        root[found] = root[parents[first]]
        word[found] = word[parents[first]]
        return found


def _reach(count: int, edges: Edges, seeds: np.ndarray, graph: _Graph
           ) -> tuple[np.ndarray, np.ndarray]:
    """Breadth-first from the roots' pointers, each block keeping its first root: a
    linked path in one step, numpy steps while the frontier is wide, a depth-first
    walk in Python while it is narrow (a doubly linked list is no path)."""
    root = np.full(count, NO_ROOT, np.int64)
    word = np.zeros(count, np.uint64)
    targets, first = np.unique(edges.dst[seeds], return_index=True)
    root[targets] = -1 - edges.src[seeds][first]
    word[targets] = edges.where[seeds][first]
    frontier = targets
    while len(frontier):
        frontier = graph.close(frontier, root, word)
        if len(frontier) < NARROW:
            frontier = _walk(frontier, root, word, graph)
        else:
            frontier = graph.expand(frontier, root, word)
    return root, word


def _walk(frontier: np.ndarray, root: np.ndarray, word: np.ndarray, graph: _Graph
          ) -> np.ndarray:
    """Depth-first from a narrow frontier for up to WALK_STEPS blocks; the blocks found
    but not yet followed (the next frontier), with those on a path, left for
    `close`.  Through memoryviews: an element is a Python int without a numpy scalar
    in between."""
    stack, deferred = frontier.tolist(), list[int]()
    ptr, to, roots, words, on_path = (memoryview(a.data) for a in (
        graph.indptr, graph.dst, root, word, graph.paths.path))
    for _ in range(WALK_STEPS):
        if not stack:
            break
        block = stack.pop()
        for i in range(ptr[block], ptr[block + 1]):
            target = to[i]
            if roots[target] == NO_ROOT:
                roots[target], words[target] = roots[block], words[block]
                (deferred if on_path[target] >= 0 else stack).append(target)
    return np.unique(np.array(stack + deferred, np.int64))


def _cliques(state: np.ndarray, indptr: np.ndarray, dst: np.ndarray, src: np.ndarray
             ) -> np.ndarray:
    """valgrind's clique pass over the unreached blocks, in address order; each
    indirectly lost block's leader (the last clique to reach it, as valgrind's).  Only
    the unreached blocks that point at or are pointed at by another take part: the
    rest stay definitely lost, alone (one in 16 of a list dropped: no Python each)."""
    leaders = np.full(len(state), -1, np.int64)
    lost = state == UNREACHED
    tied = lost[src] & lost[dst] & (src != dst)
    ptr, to, states, lead = (memoryview(a.data) for a in (indptr, dst, state, leaders))
    for leader in np.union1d(src[tied], dst[tied]).tolist():
        if states[leader] != UNREACHED:
            continue
        stack = [leader]
        while stack:
            block = stack.pop()
            for i in range(ptr[block], ptr[block + 1]):
                target = to[i]
                if target != leader and states[target] == UNREACHED:
                    states[target] = INDIRECT
                    lead[target] = leader
                    stack.append(target)
    for block in np.flatnonzero(leaders >= 0).tolist():  # a leader reached later: its own
        while lead[lead[block]] >= 0:
            lead[block] = lead[lead[block]]
    return leaders
