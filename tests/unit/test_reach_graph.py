"""The leak-kind classification (refcntd/reach/graph.py) on hand-made pointer graphs:
valgrind memcheck's rules, checked without a process."""

from __future__ import annotations

import numpy as np

from refcntd.reach import graph
from refcntd.reach.graph import INDIRECT, POSSIBLE, REACHABLE, UNREACHED, Edges


def edges(*pairs: tuple[int, int, bool]) -> Edges:
    """(src, dst, interior): src -1 is root 0."""
    src, dst, interior = zip(*pairs, strict=True) if pairs else ((), (), ())
    return Edges(np.array(src, np.int64), np.array(dst, np.int64), np.array(interior, bool),
                 np.arange(len(src), dtype=np.uint64) * np.uint64(8))


def test_chain_from_a_root_is_reachable_and_keeps_the_root():
    k = graph.classify(4, edges((-1, 0, False), (0, 1, False), (1, 2, False)))
    assert k.state.tolist() == [REACHABLE, REACHABLE, REACHABLE, UNREACHED]
    assert k.root.tolist()[:3] == [0, 0, 0]


def test_interior_pointer_anywhere_on_the_chain_is_possibly_lost():
    k = graph.classify(3, edges((-1, 0, False), (0, 1, True), (1, 2, False)))
    assert k.state.tolist() == [REACHABLE, POSSIBLE, POSSIBLE]


def test_lost_cycle_lowest_address_is_definite():
    k = graph.classify(3, edges((0, 1, False), (1, 0, False), (1, 2, True)))
    assert k.state.tolist() == [UNREACHED, INDIRECT, INDIRECT]
    assert k.leader.tolist() == [-1, 0, 0]


def test_later_leader_takes_over_an_earlier_one():
    """valgrind: block 2 leads a clique that reaches block 0, an earlier leader, and
    its block 1: both end indirect under 2."""
    k = graph.classify(3, edges((0, 1, False), (2, 0, False)))
    assert k.state.tolist() == [INDIRECT, INDIRECT, UNREACHED]
    assert k.leader.tolist() == [2, 2, -1]


def test_long_list_is_walked_whole():
    n = 100_000  # deeper than any numpy step count should be
    pairs = [(-1, 0, False)] + [(i, i + 1, False) for i in range(n - 1)]
    k = graph.classify(n, edges(*pairs))
    assert bool((k.state == REACHABLE).all())


def test_hits_keep_only_words_inside_in_use_blocks():
    starts = np.array([0x1000, 0x2000], np.uint64)
    ends = np.array([0x1040, 0x2040], np.uint64)
    words = np.array([0x2000, 0x2010, 0x3000, 0x1000, 5], np.uint64)
    src, dst, interior, where = graph._hits(0x1000, words, starts, ends, None)
    assert dst.tolist() == [1, 1, 0] and interior.tolist() == [False, True, False]
    assert src.tolist() == [0, 0, 0] and where.tolist() == [0x1000, 0x1008, 0x1018]
    src, dst, _, where = graph._hits(0x5000, words, starts, ends, None)  # not in a block
    assert len(dst) == 0
