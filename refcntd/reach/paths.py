"""Singly linked chains in the pointer graph, laid out so that reaching one block of a
chain reaches the rest of it in one numpy step.

A link is a pointer u -> v where u holds no other pointer into the heap and v is
pointed at by nothing else: once u is reached, v is, and only through u.  Links make
paths (a linked list's `next` fields); a breadth-first search would take one step
per element, which is what made a list of millions of blocks cost minutes.  The
paths are ranked in O(blocks) numpy work (a sparse ruling set: every path's head and
one member in RULER_EVERY, chosen at random with a fixed seed, walk in step to the
next ruler; the rulers' own list is ranked by pointer jumping), then stored head to
tail, each path contiguous: a reached block reaches the range after it.  Links in a
cycle (a circular list nothing else points into) are left to the search.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RULER_EVERY = 32


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
    has_in = np.zeros(count, bool)
    has_in[link[link >= 0]] = True
    members = np.flatnonzero((link >= 0) | has_in)
    heads = np.flatnonzero((link >= 0) & ~has_in)
    if not len(heads):
        return Paths(np.full(count, -1, np.int64), np.full(count, -1, np.int64),
                     np.zeros(0, np.int64), np.zeros(0, np.int64))
    sampled = members[np.random.default_rng(0).random(len(members)) < 1 / RULER_EVERY]
    rulers = np.union1d(heads, sampled)
    seg = _walk_segments(count, link, rulers)
    steps, tail = _rank_rulers(seg)
    return _layout(count, rulers, heads, seg, steps, tail)


def _links(count: int, indptr: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per block: the block its only pointer leads to, when nothing else points there."""
    one = np.flatnonzero(np.diff(indptr) == 1)
    to = dst[indptr[one]]
    indegree = np.bincount(dst, minlength=count)
    keep = (indegree[to] == 1) & (to != one)
    link = np.full(count, -1, np.int64)
    link[one[keep]] = to[keep]
    return link


def _walk_segments(count: int, link: np.ndarray, rulers: np.ndarray) -> _Segments:
    """Every ruler walks its path in step with the others until the next ruler; a
    walker records its segment's length and last block when it stops."""
    index = np.full(count, -1, np.int64)
    index[rulers] = np.arange(len(rulers))
    seg = _Segments(index.copy(), np.zeros(count, np.int64), np.ones(len(rulers), np.int64),
                    np.full(len(rulers), -1, np.int64), rulers.copy())
    ids, cur, step = np.arange(len(rulers)), rulers, 0
    while len(ids):
        step += 1
        nxt = link[cur]
        at_ruler = index[np.maximum(nxt, 0)] >= 0
        stop = (nxt < 0) | at_ruler
        if stop.any():
            ended = ids[stop]
            seg.length[ended], seg.tail[ended] = step, cur[stop]
            seg.following[ended] = np.where(nxt[stop] >= 0, index[nxt[stop]], -1)
            go = ~stop
            ids, nxt = ids[go], nxt[go]
        seg.owner[nxt], seg.offset[nxt] = ids, step
        cur = nxt
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


def _layout(count: int, rulers: np.ndarray, heads: np.ndarray, seg: _Segments,
            steps: np.ndarray, tail: np.ndarray) -> Paths:
    """Each path contiguous, heads in address order.  Per ruler (few, in cache): its
    path and the place of its segment; a block's place is its ruler's plus its offset."""
    head_ruler = seg.owner[heads]
    length = steps[head_ruler] + 1
    base = np.cumsum(length) - length
    by_tail = np.full(count, -1, np.int64)
    by_tail[tail[head_ruler]] = np.arange(len(heads))
    ruler_path = np.where(tail >= 0, by_tail[np.maximum(tail, 0)], -1)
    ruler_place = base[ruler_path] + length[ruler_path] - 1 - steps
    owned = np.flatnonzero(seg.owner >= 0)
    ruler = seg.owner[owned]
    keep = ruler_path[ruler] >= 0
    owned, ruler = owned[keep], ruler[keep]
    out = Paths(np.full(count, -1, np.int64), np.full(count, -1, np.int64),
                np.zeros(int(length.sum()), np.int64), base + length)
    out.path[owned] = ruler_path[ruler]
    out.pos[owned] = ruler_place[ruler] + seg.offset[owned]
    out.order[out.pos[owned]] = owned
    return out
