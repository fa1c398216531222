"""serve's garbage-collector pauses (gcpauses.py): measured by gc.callbacks, exported
as a histogram by generation; a refreeze leaves unreachable cycles collected and the
survivors out of the collector's walk."""

from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry, generate_latest

from refcntd.service import gcpauses
from refcntd.service.gcpauses import Freezer, GcPauses, refreeze


def _sample(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[-1])


def test_a_full_collection_is_counted_with_its_length():
    pauses = GcPauses()
    registry = CollectorRegistry()
    registry.register(pauses)
    pauses.install()
    try:
        gc.collect()
    finally:
        pauses.uninstall()
    text = generate_latest(registry).decode()
    assert _sample(text, 'refcntd_gc_pause_seconds_count{generation="2"}') == 1
    assert _sample(text, 'refcntd_gc_pause_seconds_sum{generation="2"}') > 0
    assert pauses._callback not in gc.callbacks


def test_buckets_are_cumulative_and_the_longest_is_kept():
    pauses = GcPauses()
    for seconds in (0.0005, 0.03, 0.2, 2.0):
        pauses.record(1, seconds)
    registry = CollectorRegistry()
    registry.register(pauses)
    text = generate_latest(registry).decode()
    bucket = 'refcntd_gc_pause_seconds_bucket{generation="1",le="%s"}'
    assert [_sample(text, bucket % le) for le in ("0.001", "0.05", "0.25", "+Inf")] == \
        [1, 2, 3, 4]
    assert _sample(text, 'refcntd_gc_longest_pause_seconds{generation="1"}') == 2.0


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_refreeze_collects_cycles_a_previous_freeze_kept():
    kept = _Node()
    gone = weakref.ref(kept)
    try:
        refreeze()
        assert gc.get_freeze_count() > 0 and gone() is not None
        del kept  # garbage now, but frozen: no automatic collection would see it
        gc.collect()
        assert gone() is not None
        refreeze()
        assert gone() is None
    finally:
        gc.unfreeze()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


def _freezer(monkeypatch) -> tuple[Freezer, _Clock, list[str]]:  # noqa: ANN001
    clock, calls = _Clock(), []
    monkeypatch.setattr(gcpauses, "time", clock)
    monkeypatch.setattr(gcpauses, "refreeze", lambda: calls.append("full"))
    monkeypatch.setattr(gcpauses, "freeze_new", lambda: calls.append("young"))
    monkeypatch.setattr(gc, "set_threshold", lambda *_: None)  # the test's own stay
    return Freezer(GcPauses()), clock, calls


def test_a_freeze_waits_for_the_moment_after_a_scrape(monkeypatch):
    """Prometheus scrapes every few seconds: a pause started within a second of a
    scrape's end is furthest from the next one."""
    freezer, clock, calls = _freezer(monkeypatch)
    freezer.pauses.last_scrape = clock.now - 2.0
    freezer.tick()
    assert calls == []  # start-up's young freeze is due, but a scrape may be near
    list(freezer.pauses.collect())  # a scrape ends
    clock.now += 0.5
    freezer.tick()
    assert calls == ["young"]


def test_young_every_minute_full_every_ten_and_at_a_detach(monkeypatch):
    freezer, clock, calls = _freezer(monkeypatch)  # nobody scrapes: always quiet
    for _ in range(12):  # 12 minutes, a tick a second
        for _ in range(60):
            freezer.tick()
            clock.now += 1.0
    assert calls.count("full") == 1 and calls.count("young") == 11, calls
    calls.clear()
    freezer.full_due = True  # a detach
    freezer.tick()
    assert calls == ["full"]


def test_python_makes_no_full_collection_of_its_own_while_a_freezer_runs():
    before = gc.get_threshold()
    freezer = Freezer(GcPauses())
    try:
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 1 << 20
    finally:
        freezer.close()
    assert gc.get_threshold() == before
