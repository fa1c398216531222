"""age_view: the kernel's creation-time bins as ages, and which bins can go."""

from __future__ import annotations

from refcntd.kernel import abi
from refcntd.kernel.decode import AGE_FINE_HORIZON_NS, age_view

FINE, COARSE = 1 << abi.AGE_FINE_SHIFT, 1 << abi.AGE_COARSE_SHIFT
WHO = (7, 1, 99, 0)


def rows(*objects_ns: int, now: int) -> list[tuple[int, int, int, int, int, int]]:
    """What bpf/refcntd.c's count_age leaves for objects created at these times."""
    counts: dict[int, int] = {}
    for t in objects_ns:
        if now - t <= AGE_FINE_HORIZON_NS:
            counts[t >> abi.AGE_FINE_SHIFT] = counts.get(t >> abi.AGE_FINE_SHIFT, 0) + 1
        c = abi.AGE_COARSE | (t >> abi.AGE_COARSE_SHIFT)
        counts[c] = counts.get(c, 0) + 1
    return [(*WHO, b, n) for b, n in counts.items()]


def ages(bins: list, now: int) -> list[tuple[float, int]]:
    return sorted(((now - (start + end) / 2) / 1e9, n) for _, start, end, n in bins)


def test_every_object_is_counted_once_with_its_age_to_a_bin():
    now = 10_000 * 10**9
    born = [now - 1 * 10**9, now - 30 * 10**9, now - 30 * 10**9, now - 2000 * 10**9,
            now - 7200 * 10**9]
    bins, doomed = age_view(rows(*born, now=now), now)
    assert doomed == []
    assert sum(n for *_, n in bins) == len(born)
    got = ages(bins, now)
    want = sorted((now - t) / 1e9 for t in born)
    # recent objects to a fine bin (~1 s), older ones to a coarse bin (~2 min)
    expanded = [a for a, n in got for _ in range(n)]
    for a, w in zip(expanded, want, strict=True):
        assert abs(a - w) <= (FINE if w < 590 else COARSE) / 1e9, (a, w)


def test_a_coarse_bin_straddling_the_fine_window_is_not_counted_twice():
    now = (1000 * COARSE) + 100 * 10**9  # the window's cut falls inside a coarse bin
    born = [now - 580 * 10**9, now - 590 * 10**9 - 2 * FINE, now - 650 * 10**9]
    bins, _ = age_view(rows(*born, now=now), now)
    assert sum(n for *_, n in bins) == 3


def test_bins_nothing_can_reach_are_dropped_and_live_ones_kept():
    now = 100_000 * 10**9
    old_fine = ((now - AGE_FINE_HORIZON_NS) >> abi.AGE_FINE_SHIFT) - 5
    empty_old_coarse = abi.AGE_COARSE | ((now - 2 * 3600 * 10**9) >> abi.AGE_COARSE_SHIFT)
    live_old_coarse = abi.AGE_COARSE | ((now - 3 * 3600 * 10**9) >> abi.AGE_COARSE_SHIFT)
    recent_empty = abi.AGE_COARSE | ((now - 60 * 10**9) >> abi.AGE_COARSE_SHIFT)
    table = [(*WHO, old_fine, 3), (*WHO, empty_old_coarse, 0), (*WHO, live_old_coarse, 2),
             (*WHO, recent_empty, 0)]
    bins, doomed = age_view(table, now)
    assert doomed == [0, 1]
    assert [n for *_, n in bins] == [2]
