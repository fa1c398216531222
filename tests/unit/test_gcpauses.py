"""serve's garbage-collector pauses (gcpauses.py): measured by gc.callbacks, exported
as a histogram by generation; a refreeze leaves unreachable cycles collected and the
survivors out of the collector's walk."""

from __future__ import annotations

import gc
import weakref

from prometheus_client import CollectorRegistry, generate_latest

from refcntd.service import gcpauses
from refcntd.service.gcpauses import Freezer, GcPauses, refreeze
from refcntd.service.scrapeclock import ScrapeClock


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

    def pause(kind: str, seconds: float, frozen: int) -> int:
        calls.append(kind)
        clock.now += seconds  # what the freezer measures, and expects next time
        return frozen
    monkeypatch.setattr(gcpauses, "refreeze", lambda: pause("full", 0.3, 7))
    monkeypatch.setattr(gcpauses, "freeze_new", lambda: pause("young", 0.01, 5))
    monkeypatch.setattr(gc, "set_threshold", lambda *_: None)  # the test's own stay
    return Freezer(GcPauses(), ScrapeClock()), clock, calls


def _read(freezer: Freezer, clock: _Clock, agent: str) -> None:
    freezer.clock.started("127.0.0.1", agent, "/metrics", clock.now)
    freezer.clock.ended()


def test_a_pause_never_meets_a_due_reader(monkeypatch):
    """The hour's soak: Prometheus every 5 s, and a sampler reading /metrics once a
    minute 0.2 s before one of Prometheus's scrapes.  "Just after a scrape" was then
    just before the next.  Every freeze must start where neither is due within the
    pause it expects (0.3 s for a full one, before one is measured)."""
    freezer, clock, calls = _freezer(monkeypatch)
    freezer.full_due = True
    starts = []
    for step in range(20 * 60 * 20):  # 20 minutes, a tick every 50 ms
        clock.now = 1000.0 + step * 0.05
        in_period = round(clock.now - 1000.0, 2)
        if in_period % 5 == 0:
            _read(freezer, clock, "Prometheus/2.42.0")
        if in_period % 60 == 4.8:
            _read(freezer, clock, "Python-urllib/3.11")
        before = len(calls)
        freezer.tick()
        if len(calls) > before:
            starts.append(in_period)
        if round(in_period % 300, 2) == 4.7:
            freezer.full_due = True  # a detach every five minutes, just before the sampler
    assert calls.count("full") >= 5 and calls.count("young") >= 10, calls
    for at, kind in zip(starts, calls, strict=True):
        if at < 125:  # the sampler's period is known from its third read (124.8 s)
            continue
        to_prometheus = 5 - at % 5
        to_sampler = (4.8 - at) % 60
        pause = 0.3 if kind == "full" else 0.01
        assert min(to_prometheus, to_sampler) > pause, (at, kind, to_prometheus, to_sampler)
    assert freezer.pauses.forced == 0


def test_a_pause_waits_at_most_max_wait(monkeypatch):
    """Readers that leave no gap as wide as the pause: it is taken anyway, counted."""
    freezer, clock, calls = _freezer(monkeypatch)
    for step in range(int(gcpauses.MAX_WAIT_S / 0.05) + 40):
        clock.now = 1000.0 + step * 0.05
        if step % 4 == 0:  # a reader every 0.2 s: never 0.45 s clear
            _read(freezer, clock, "busy")
        if step == 10:
            freezer.full_due = True
        freezer.tick()
        if step == int(gcpauses.MAX_WAIT_S / 0.05):
            assert "full" not in calls  # young ones fit between the reads; a full one not
    assert calls.count("full") == 1 and freezer.pauses.forced == 1


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
    freezer = Freezer(GcPauses(), ScrapeClock())
    try:
        assert gc.get_threshold()[:2] == before[:2] and gc.get_threshold()[2] > 1 << 20
    finally:
        freezer.close()
    assert gc.get_threshold() == before


def test_a_scrape_does_not_count_the_frozen_objects(monkeypatch):
    """gc.get_freeze_count() walks the permanent generation's whole list with the GIL
    held (about 35 ms per scrape at 226 000 objects in the hour's soak): the gauge is
    the count taken at the last freeze."""
    freezer, clock, calls = _freezer(monkeypatch)
    freezer.tick()
    assert calls == ["young"]

    def walked() -> int:
        raise AssertionError("a scrape walked the frozen objects")
    monkeypatch.setattr(gc, "get_freeze_count", walked)
    (gauge,) = [m for m in freezer.pauses.collect() if m.name == "refcntd_gc_frozen_objects"]
    assert gauge.samples[0].value == 5


def test_the_minutes_freeze_collects_cycles_that_outlived_the_young_collections():
    """A report's or a scan's cycle lives seconds, long enough to reach the oldest
    generation; when it dies, the next minute's freeze must collect it rather than
    freeze it (before: only the next refreeze, up to ten minutes on)."""
    gc.collect()
    node = _Node()
    gc.collect(1)  # survived the young generations: now in the oldest
    dead = weakref.ref(node)
    del node
    try:
        gcpauses.freeze_new()
        assert dead() is None
    finally:
        gc.unfreeze()
