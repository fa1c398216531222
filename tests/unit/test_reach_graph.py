"""The leak-kind classification (refcntd/reach/graph.py) on hand-made pointer graphs:
valgrind memcheck's rules, checked without a process."""

from __future__ import annotations

import numpy as np

from refcntd.reach import graph
from refcntd.reach.chunks import Chunks
from refcntd.reach.glibc import _in_use
from refcntd.reach.graph import INDIRECT, POSSIBLE, REACHABLE, UNREACHED, Edges


def edges(*pairs: tuple[int, int, bool]) -> Edges:
    """(src, dst, interior): src -1 is root 0."""
    src, dst, interior = zip(*pairs, strict=True) if pairs else ((), (), ())
    where = np.arange(len(src), dtype=np.uint64) * np.uint64(8)
    return Edges(np.array(src, np.int64), np.array(dst, np.int64), np.array(interior, bool),
                 where, where)


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
    src, dst, interior, where, value = graph._hits(0x1000, words, starts, ends, None)
    assert dst.tolist() == [1, 1, 0] and interior.tolist() == [False, True, False]
    assert value.tolist() == [0x2000, 0x2010, 0x1000]
    assert src.tolist() == [0, 0, 0] and where.tolist() == [0x1000, 0x1008, 0x1018]
    src, dst, _, where, _ = graph._hits(0x5000, words, starts, ends, None)  # not in a block
    assert len(dst) == 0


def test_a_blocks_last_word_is_the_next_chunks_prev_size():
    """An in-use chunk's usable bytes end with the next chunk's prev_size (malloc_usable_size):
    a pointer stored there is the block's (GFilterOutputStream's base_stream was), while a
    pointer to that word is one to the next chunk's header, not into the block."""
    starts = np.array([0x1010, 0x1060], np.uint64)
    ends = np.array([0x1050, 0x10a0], np.uint64)
    tails = ends + np.uint64(8)
    words = np.array([0x1060, 0x1050], np.uint64)  # at 0x1050: the last word of block 0
    src, dst, _, where, _ = graph._hits(0x1050, words, starts, ends, None, tails=tails)
    assert src.tolist() == [0] and dst.tolist() == [1] and where.tolist() == [0x1050]
    src, dst, _, _, _ = graph._hits(0x1050, words, starts, ends, None)  # without tails: lost
    assert len(dst) == 0


def test_tails_of_heap_chunks_and_of_mmapped_ones():
    heap = Chunks(np.array([0x1000, 0x1050, 0x10a0], np.uint64),
                  np.array([0x50, 0x50, 0x100], np.uint64), np.array([True, True, False]))
    big = Chunks(np.array([0x8000], np.uint64), np.array([0x2000], np.uint64),
                 np.array([True]), mmapped=True)
    starts, ends, tails = _in_use([big, heap])
    assert starts.tolist() == [0x1010, 0x1060, 0x8010]
    assert ends.tolist() == [0x1050, 0x10a0, 0xa000]
    assert tails.tolist() == [0x1058, 0x10a8, 0xa000]  # a mapping has no next chunk
