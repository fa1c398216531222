"""The numpy reachability (linked paths, frontier steps, the narrow walk, cliques) and
the numpy chunk walk against plain step-by-step versions of the same rules, on
random graphs shaped like heaps: singly and doubly linked lists, circular lists,
trees, lost structures, interior pointers."""

from __future__ import annotations

import numpy as np
import pytest

from refcntd.reach import chunks, graph, paths
from refcntd.reach.graph import INDIRECT, POSSIBLE, REACHABLE, UNREACHED, Edges


def heap_graph(seed: int, count: int) -> Edges:
    """Lists (some doubly linked or circular), trees and stray pointers; a few roots."""
    rng = np.random.default_rng(seed)
    pairs: list[tuple[int, int, bool]] = []
    blocks = rng.permutation(count)
    at = 0
    while at < count:
        size = int(rng.integers(1, count // 4 + 2))
        part = blocks[at:at + size].tolist()
        at += size
        shape = rng.integers(4)
        for i in range(len(part) - 1):
            parent = part[(i - 1) // 2 + 1] if shape == 3 and i else part[i]
            pairs.append((parent, part[i + 1], bool(rng.random() < 0.05)))
            if shape == 1:
                pairs.append((part[i + 1], part[i], False))
        if shape == 2 and len(part) > 1:
            pairs.append((part[-1], part[0], False))
        if rng.random() < 0.6:
            pairs.append((-1 - int(rng.integers(3)), part[int(rng.integers(len(part)))],
                          bool(rng.random() < 0.2)))
    for _ in range(count // 10):
        pairs.append((int(rng.integers(count)), int(rng.integers(count)), False))
    src, dst, interior = (np.array(x) for x in zip(*pairs, strict=True))
    where = np.arange(len(src), dtype=np.uint64)
    return Edges(src.astype(np.int64), dst.astype(np.int64), interior.astype(bool), where,
                 where)


def reached_by(count: int, e: Edges, strict: bool) -> dict[int, set[int]]:
    """Per block, the roots it is reachable from (step by step)."""
    out: dict[int, set[int]] = {b: set() for b in range(count)}
    nxt: dict[int, list[int]] = {}
    for s, d, i in zip(e.src.tolist(), e.dst.tolist(), e.interior.tolist(), strict=True):
        if not (strict and i):
            nxt.setdefault(s, []).append(d)
    for r in {s for s in e.src.tolist() if s < 0}:
        stack, seen = list(nxt.get(r, [])), set()
        while stack:
            b = stack.pop()
            if b not in seen:
                seen.add(b)
                out[b].add(-1 - r)
                stack += nxt.get(b, [])
    return out


def reference_cliques(state: list[int], e: Edges) -> list[int]:
    """valgrind's pass as written in mc_leakcheck.c: every unreached block in order."""
    nxt: dict[int, list[int]] = {}
    for s, d in zip(e.src.tolist(), e.dst.tolist(), strict=True):
        if s >= 0:
            nxt.setdefault(s, []).append(d)
    leaders = [-1] * len(state)
    for leader in range(len(state)):
        if state[leader] != UNREACHED:
            continue
        stack = [leader]
        while stack:
            for t in nxt.get(stack.pop(), []):
                if t != leader and state[t] == UNREACHED:
                    state[t], leaders[t] = INDIRECT, leader
                    stack.append(t)
    for b in range(len(state)):
        while leaders[b] >= 0 and leaders[leaders[b]] >= 0:
            leaders[b] = leaders[leaders[b]]
    return leaders


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("narrow", [1, 256])
def test_classify_equals_step_by_step(seed: int, narrow: int, monkeypatch) -> None:
    """narrow 1: numpy steps only; 256: the Python walk too, stopped every 50 blocks."""
    monkeypatch.setattr(graph, "NARROW", narrow)
    monkeypatch.setattr(graph, "WALK_STEPS", 50)
    count = 3000
    e = heap_graph(seed, count)
    if seed % 3 == 0:  # interior pointers only from roots: one graph for both passes
        e.interior &= e.src < 0
    k = graph.classify(count, e)
    loose, strict = reached_by(count, e, False), reached_by(count, e, True)
    expected = [REACHABLE if strict[b] else POSSIBLE if loose[b] else UNREACHED
                for b in range(count)]
    state = [s if s in (REACHABLE, POSSIBLE) else UNREACHED for s in k.state.tolist()]
    assert state == expected
    for b in range(count):
        assert (int(k.root[b]) in loose[b]) if loose[b] else k.root[b] == graph.NO_ROOT
    assert k.leader.tolist() == reference_cliques(expected, e)
    assert k.state.tolist() == expected


def test_a_long_list_is_one_path_in_order() -> None:
    n = 200_000
    indptr = np.concatenate(([0, 0], np.arange(1, n)))  # n-1 -> n-2 -> ... -> 0, as heapfill
    found = paths.find_paths(n, indptr, np.arange(n - 1))
    assert found.order.tolist() == list(range(n - 1, -1, -1))
    assert found.end.tolist() == [n]


def test_circular_list_is_left_to_the_search() -> None:
    found = paths.find_paths(3, np.array([0, 1, 2, 3]), np.array([1, 2, 0]))
    assert found.path.tolist() == [-1, -1, -1]


class Words:
    """A fake address space for chunks.walk: one array of words at `base`."""

    def __init__(self, base: int, words: list[int]) -> None:
        self.base, self.words = base, np.array(words, np.uint64)

    def words_at(self, address: int, size: int, reuse: bool = False) -> np.ndarray:
        i = (address - self.base) // 8
        return self.words[i:i + size // 8].copy()


def chunk_heap(seed: int, fake_headers: bool) -> tuple[Words, list[tuple[int, int, bool]]]:
    """Chunks of random sizes (user data full of header-like words when asked), the
    last one the top; the truth as (address, size, in use)."""
    rng = np.random.default_rng(seed)
    base, words, truth = 0x10000, [], []
    for i in range(4000):
        size = 16 * int(rng.integers(2, 80 if i < 3999 else 3))
        inuse = bool(rng.random() < 0.7) and i < 3999
        truth.append((base + 8 * len(words), size, inuse))
        body = [0x21 + 16 * int(rng.integers(3)) if fake_headers else 0
                for _ in range(size // 8 - 2)]
        words += [0, size] + body
    for i, (_, _, inuse) in enumerate(truth[:-1]):  # PREV_INUSE lives in the next one
        words[(truth[i + 1][0] - base) // 8 + 1] |= int(inuse)
    return Words(base, words), truth


def test_the_compiled_walker_is_built() -> None:
    """scripts/setup.sh builds it; without it the live scan's stop is many times longer
    (the scan says so in a note, test_a_scan_without_it_says_so)."""
    assert chunks.compiled() is not None, f"{chunks.COMPILED} missing: bash scripts/setup.sh"
    assert chunks.missing_note() is None


def test_a_scan_without_it_says_so(monkeypatch) -> None:
    monkeypatch.setattr(chunks, "compiled", lambda: None)
    note = chunks.missing_note()
    assert note is not None and "scripts/setup.sh" in note and "_chunkwalk.so" in note


WALKERS = [pytest.param(True, id="numpy"), pytest.param(False, id="compiled")]


@pytest.mark.parametrize("numpy_only", WALKERS)
@pytest.mark.parametrize("fake", [False, True])
def test_chunk_walk_finds_exactly_the_chain(fake: bool, numpy_only: bool, monkeypatch) -> None:
    monkeypatch.setattr(chunks, "WINDOW", 1 << 12)  # many windows, chunks across them
    mem, truth = chunk_heap(7, fake)
    end = truth[-1][0] + truth[-1][1]
    run = chunks.walk(mem, truth[0][0], end, numpy_only)  # type: ignore[arg-type]
    assert run is not None
    got = list(zip(run.addr.tolist(), run.size.tolist(), run.inuse.tolist(), strict=True))
    assert got == truth


def test_the_walk_hands_every_word_once_to_its_sink(monkeypatch) -> None:
    """The heap read once (graph.read_words reads only what the walk did not): the
    sink gets each word from the start up to read_to once, in order, chunks longer
    than the window included."""
    monkeypatch.setattr(chunks, "WINDOW", 1 << 9)  # most chunks are longer
    mem, truth = chunk_heap(5, True)
    end = truth[-1][0] + truth[-1][1]
    got: list[tuple[int, list[int]]] = []
    run = chunks.walk(mem, truth[0][0], end,  # type: ignore[arg-type]
                      sink=lambda base, words: got.append((base, words.tolist())))
    assert run is not None and run.read_to == end
    at = truth[0][0]
    for base, words in got:
        assert base == at
        at += 8 * len(words)
    assert at == end
    assert [w for _, words in got for w in words] == mem.words.tolist()


@pytest.mark.parametrize("numpy_only", WALKERS)
def test_torn_heap_is_refused(numpy_only: bool) -> None:
    mem, truth = chunk_heap(3, False)
    mem.words[(truth[2000][0] - mem.base) // 8 + 1] = 8  # a size that cannot be
    end = truth[-1][0] + truth[-1][1]
    assert chunks.walk(mem, truth[0][0], end, numpy_only) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_both_walkers_agree_on_any_words(seed: int, monkeypatch) -> None:
    """Torn and odd heaps (a size broken anywhere, a chunk past the end, the end in the
    top's last page, a first word that is no header): the same chunks or the same
    refusal from both."""
    monkeypatch.setattr(chunks, "WINDOW", 1 << 12)
    rng = np.random.default_rng(seed)
    mem, truth = chunk_heap(seed, bool(seed % 2))
    end = truth[-1][0] + truth[-1][1]
    walked = 0
    for i in range(15):
        broken = Words(mem.base, mem.words.tolist())
        at = int(rng.integers((len(truth) - 20) * (i % 2), len(truth)))  # or near the top
        broken.words[(truth[at][0] - mem.base) // 8 + 1] = int(rng.choice(
            [8, 16, 0x19, 0x48, 0x1009, 1 << 40, truth[at][1] + 16 * int(rng.integers(1, 4)),
             0x31]))
        for stop in (end, end - 16 * int(rng.integers(1, 300))):
            runs = [chunks.walk(broken, truth[0][0], stop, numpy_only)  # type: ignore[arg-type]
                    for numpy_only in (True, False)]
            if runs[0] is None or runs[1] is None:
                assert runs[0] is None and runs[1] is None
                continue
            walked += 1
            for field in ("addr", "size", "inuse"):
                assert getattr(runs[0], field).tolist() == getattr(runs[1], field).tolist()
    assert walked  # not only refusals


@pytest.mark.parametrize("seed", range(5))
def test_freed_chunks_are_matched_as_isin_does(seed):
    """The chunks in fastbins and tcaches, left out of the heap by a binary search
    per chunk (glibc._members), the same as numpy's isin."""
    from refcntd.reach.glibc import _members
    rng = np.random.default_rng(seed)
    items = np.sort(rng.choice(1 << 20, 5000, replace=False).astype(np.uint64) * 16)
    free = np.unique(np.concatenate([rng.choice(items, int(rng.integers(0, 2000))),
                                     rng.integers(0, 1 << 24, 50).astype(np.uint64)]))
    assert (_members(items, free) == np.isin(items, free)).all()
    assert not _members(items, free[:0]).any()


@pytest.mark.parametrize("seed", range(3))
def test_compiled_pointer_filter_keeps_what_numpy_keeps(seed: int) -> None:
    """graph.PointerFilter (chunkwalk.c's refcntd_pointers) against graph._candidates: the
    same words, in order, with the same addresses, at both ends of the span too."""
    rng = np.random.default_rng(seed)
    lo, hi = np.uint64(0x5555_0000_0000), np.uint64(0x5555_0100_0000)
    words = rng.integers(0, 1 << 47, 100_000, dtype=np.uint64)
    words[::7] = rng.integers(int(lo) - 64, int(hi) + 64, len(words[::7]), dtype=np.uint64)
    words[:4] = [lo, hi, lo - np.uint64(1), hi - np.uint64(1)]
    keep, out = graph.PointerFilter(lo, hi), graph.Words()
    assert keep.lib is not None
    for at in range(0, len(words), 30_000):  # windows, filling more than one block
        keep.add_to(out, 0x7000_0000 + 8 * at, words[at:at + 30_000], 3)
    want = graph._candidates(0x7000_0000, words, lo, hi)
    assert np.concatenate(out.values).tolist() == want[0].tolist()
    assert np.concatenate(out.where).tolist() == want[1].tolist()
    assert out.owner == [3] * len(out.values) and len(out.values) == 4
    assert out.values[0][:2].tolist() == [lo, hi - np.uint64(1)]


class _Mapped:
    """Memory mapped only in [start, end): reads beginning outside it get nothing, reads
    running past its end stop there (process_vm_readv's partial reads)."""

    def __init__(self, start: int, data: bytes) -> None:
        self.start, self.data, self.reads = start, data, 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        at = address - self.start
        return b"" if not 0 <= at < len(self.data) else self.data[at:at + size]

    def word(self, address: int) -> int | None:
        got = self.read(address, 8)
        return int.from_bytes(got, "little") if len(got) == 8 else None


def test_pages_read_a_heap_not_on_a_window_boundary_once() -> None:
    """A heap 0x7000 bytes into a 64 KiB window: its words come from one read, not one
    each; what lies before the heap's mapping is unreadable, as it is."""
    from refcntd.reach.glibc import _Pages
    start = 0x5555_0000_7000
    data = b"".join((start + i).to_bytes(8, "little") for i in range(0, 0x3000, 8))
    mem = _Mapped(start, data)
    pages = _Pages(mem)  # type: ignore[arg-type]
    assert [pages.word(start + i) for i in (0x2a0, 0x10, 0x1ff8)] == \
        [start + 0x2a0, start + 0x10, start + 0x1ff8]
    assert mem.reads == 2  # the aligned window (nothing there), then from the page on
    assert pages.word(start - 8) is None and pages.word(start + 0x3000) is None
