"""Singly linked chains in the pointer graph, laid out so that reaching one block of a
chain reaches the rest of it in one numpy step.

A link is a pointer u -> v where u holds no other pointer into the heap and v is
pointed at by nothing else: once u is reached, v is, and only through u.  Links make
paths (a linked list's `next` fields); a breadth-first search would take one step
per element, which is what made a list of millions of blocks cost minutes.  The
paths are ranked in O(blocks) numpy work (a sparse ruling set: every path's head and
one member in RULER_EVERY, chosen by a hash of its index, walk in step to the
next ruler; the rulers' own list is ranked by pointer jumping), then stored head to
tail, each path contiguous: a reached block reaches the range after it.  Links in a
cycle (a circular list nothing else points into) are left to the search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RULER_EVERY = 32
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / the golden ratio
_RULER_SHIFT = np.uint64(64 - 5)  # the top 5 bits: one index in 32 (RULER_EVERY)


@dataclass
class Paths:
    path: np.ndarray  # per block: its path, or -1
    pos: np.ndarray  # per block: its place in `order`
    order: np.ndarray  # the blocks of every path, head to tail, each path contiguous
    end: np.ndarray  # per path: the place after its tail in `order`


@dataclass
class _Segments:
    """What each ruler's walk found: the blocks after it up to the next ruler."""

    owner: np.ndarray  # per block: the ruler whose segment holds it, or -1
    offset: np.ndarray  # per block: steps from that ruler
    length: np.ndarray  # per ruler: blocks in its segment (itself included)
    following: np.ndarray  # per ruler: the next ruler on its path, or -1
    tail: np.ndarray  # per ruler: the last block of its segment


def find_paths(count: int, indptr: np.ndarray, dst: np.ndarray) -> Paths:
    """The paths of the graph given as CSR (indptr over `count` blocks, targets dst)."""
    link = _links(count, indptr, dst)
    linked = link >= 0
    has_in = np.zeros(count, bool)
    has_in[link[linked]] = True
    starting = linked & ~has_in
    if not starting.any():
        return Paths(np.full(count, -1, np.int64), np.full(count, -1, np.int64),
                     np.zeros(0, np.int64), np.zeros(0, np.int64))
    # rulers: every head, and the members whose index hashes (Fibonacci hashing, a fixed
    # spread that needs no random numbers) into one slot of RULER_EVERY
    hashed = np.arange(count, dtype=np.uint64)  # in place: one array of `count` words
    hashed *= _GOLDEN
    hashed >>= _RULER_SHIFT
    rulers = np.flatnonzero(starting | ((hashed == 0) & (linked | has_in)))
    heads = np.flatnonzero(starting)
    seg = _walk_segments(count, link, rulers)
    steps, tail = _rank_rulers(seg)
    return _layout(count, heads, seg, steps, tail)


def _links(count: int, indptr: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per block: the block its only pointer leads to, when nothing else points there."""
    one = np.flatnonzero(np.diff(indptr) == 1)
    to = dst.take(indptr[one])
    indegree = np.bincount(dst, minlength=count)
    keep = (indegree.take(to) == 1) & (to != one)
    link = np.full(count, -1, np.int64)
    link[one[keep]] = to[keep]
    return link


def _walk_segments(count: int, link: np.ndarray, rulers: np.ndarray) -> _Segments:
    """Every ruler walks its path in step with the others until the next ruler; a
    walker records its segment's length and last block when it stops.  A missing
    link leads to the slot `count`, which is marked the end (-2), so that one lookup
    per step says both whether a walker stops and at which ruler."""
    index = np.full(count + 1, -1, np.int64)
    index[rulers] = np.arange(len(rulers))
    index[count] = -2
    step_to = np.where(link >= 0, link, count)
    seg = _Segments(np.full(count + 1, -1, np.int64), np.zeros(count + 1, np.int64),
                    np.ones(len(rulers), np.int64), np.full(len(rulers), -1, np.int64),
                    rulers.copy())
    seg.owner[rulers] = np.arange(len(rulers))
    ids, cur, step = np.arange(len(rulers)), rulers, 0
    while len(ids):
        step += 1
        nxt = step_to.take(cur)
        at = index.take(nxt)
        stop = at != -1
        if stop.any():
            ended = ids[stop]
            seg.length[ended], seg.tail[ended] = step, cur[stop]
            seg.following[ended] = np.maximum(at[stop], -1)
            go = ~stop
            ids, nxt = ids[go], nxt[go]
        seg.owner[nxt], seg.offset[nxt] = ids, step
        cur = nxt
    seg.owner, seg.offset = seg.owner[:count], seg.offset[:count]
    return seg


def _rank_rulers(seg: _Segments) -> tuple[np.ndarray, np.ndarray]:
    """Per ruler: link steps to its path's tail and that tail (-1 for a ruler in a
    cycle), by pointer jumping over the rulers' list."""
    steps = np.where(seg.following >= 0, seg.length, seg.length - 1)
    tail, jump = seg.tail.copy(), seg.following.copy()
    for _ in range(2 + int(np.log2(len(jump) + 1))):
        active = np.flatnonzero(jump >= 0)
        if not len(active):
            break
        to = jump[active]
        steps[active] += steps[to]
        tail[active] = tail[to]
        jump[active] = jump[to]
    tail[jump >= 0] = -1  # never ended: a cycle
    return steps, tail


def _layout(count: int, heads: np.ndarray, seg: _Segments, steps: np.ndarray,
            tail: np.ndarray) -> Paths:
    """Each path contiguous, heads in address order.  Per ruler (few, in cache): its
    path and the place of its segment; a block's place is its ruler's plus its offset.
    A ruler's path is found from its tail: the heads' tails, sorted, searched."""
    head_ruler = seg.owner.take(heads)
    length = steps.take(head_ruler) + 1
    base = np.cumsum(length) - length
    head_tail = tail.take(head_ruler)
    order = np.argsort(head_tail)
    at = np.minimum(np.searchsorted(head_tail, tail, sorter=order), len(order) - 1)
    found = order.take(at)
    ruler_path = np.where((tail >= 0) & (head_tail.take(found) == tail), found, -1)
    ruler_place = base.take(ruler_path) + length.take(ruler_path) - 1 - steps
    owned = np.flatnonzero(seg.owner >= 0)
    ruler = seg.owner.take(owned)
    path = ruler_path.take(ruler)
    if not bool((path >= 0).all()):  # rulers in a cycle: their segments are no path
        keep = path >= 0
        owned, ruler, path = owned[keep], ruler[keep], path[keep]
    out = Paths(np.full(count, -1, np.int64), np.full(count, -1, np.int64),
                np.zeros(int(length.sum()), np.int64), base + length)
    out.path[owned] = path
    pos = ruler_place.take(ruler) + seg.offset.take(owned)
    out.pos[owned] = pos
    out.order[pos] = owned
    return out
