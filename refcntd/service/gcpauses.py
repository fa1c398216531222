"""Python's cyclic garbage collector in a daemon that runs for months: what its
pauses cost (a metric), and keeping its full collections short.

A full (generation 2) collection walks every object the collector tracks while
holding the GIL.  In the soak serve's took 86-202 ms of CPU each, every 10-60 s,
and a scrape arriving meanwhile waited for it (the soak of 2026-11-28:
`git show dc0f3e0:benchmarks/results/soak-gc.md`).
Most of those objects live as long as the process: modules, classes, the attached
tracers' symbol tables, bounded caches.  `refreeze()` moves the survivors of a full
collection into the permanent generation (`gc.freeze()`), and `freeze_new()` what
came since; `Freezer` says when, in the daemon's own loop at a moment no scrape is due,
and turns Python's own full collections off (its young ones stay: under 10 ms).

The permanent generation is never collected: a detached tracer's reference
cycles (pyelftools' structs, ctypes classes, its callbacks: ~22 MiB per tracer)
would stay forever.  So after a detach and every ten minutes a
refreeze begins with `gc.unfreeze()` and one full collection: one pause, taken by
the daemon's own loop outside its lock, instead of several a minute on whichever
thread allocates; and a detached tracer is freed within seconds, not minutes
later.  Cycles frozen while alive that die later wait for the next refreeze:
at most ten minutes' worth.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from refcntd.service.scrapeclock import ScrapeClock

log = logging.getLogger("refcntd")
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = 3


class GcPauses:
    """Each collection's wall time by generation, from `gc.callbacks`; a Prometheus
    collector.  The callbacks run with the GIL held, in the collecting thread: plain
    integer updates need no lock."""

    def __init__(self) -> None:
        self.counts = [[0] * (len(BUCKETS) + 1) for _ in range(GENERATIONS)]
        self.sums = [0.0] * GENERATIONS
        self.longest = [0.0] * GENERATIONS
        self._started = 0.0
        # as counted after the last freeze: gc.get_freeze_count() walks the permanent
        # generation's list (226 000 objects in the soak: ~35 ms of GIL per scrape)
        self.frozen = 0
        self.forced = 0  # freezes taken after MAX_WAIT_S with a reader due (Freezer)

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.record(info["generation"], time.perf_counter() - self._started)

    def record(self, generation: int, seconds: float) -> None:
        bucket = next((i for i, le in enumerate(BUCKETS) if seconds <= le), len(BUCKETS))
        self.counts[generation][bucket] += 1
        self.sums[generation] += seconds
        self.longest[generation] = max(self.longest[generation], seconds)

    def collect(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily(
            "refcntd_gc_pause_seconds", "Python garbage collections of refcntd, by "
            "generation, and how long each held the interpreter (a scrape waits)",
            labels=["generation"])
        longest = GaugeMetricFamily(
            "refcntd_gc_longest_pause_seconds", "The longest collection so far, by generation",
            labels=["generation"])
        for gen in range(GENERATIONS):
            cumulative, buckets = 0, []
            for le, n in zip([*map(str, BUCKETS), "+Inf"], self.counts[gen], strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            pauses.add_metric([str(gen)], buckets, self.sums[gen])
            longest.add_metric([str(gen)], self.longest[gen])
        yield pauses
        yield longest
        yield GaugeMetricFamily("refcntd_gc_frozen_objects", "Objects kept out of the "
                                "automatic collections' walk (gc.freeze), counted at the "
                                "last freeze", self.frozen)
        yield CounterMetricFamily("refcntd_gc_unscheduled_pauses", "Freezes taken while "
                                  "an HTTP reader was due, after waiting the longest "
                                  "allowed for a moment none was", self.forced)


def freeze_new() -> int:
    """After an attach and every minute: what is not frozen collected, then
    everything frozen, the new tracer with it.  A full collection, but of the unfrozen
    objects only (the permanent generation is not walked): what the last minute made.
    Collecting the young generations alone left every cycle that lived through two
    of them (a report's, a scan's: seconds) for the next refreeze, up to ten minutes
    on, with whatever memory hung from it: steps of +167 and +234 MiB of RSS on two
    GStreamer pipelines (issue 58).  A tracer's own cycles are collected at the next
    refreeze, which every detach makes."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def refreeze() -> int:
    """Collect everything (also what the last freeze kept: detached tracers), then
    move what survives out of the automatic collections' walk; the objects frozen."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("garbage collector: %d objects frozen in %.0f ms", frozen,
             (time.perf_counter() - started) * 1000)
    return frozen


YOUNG_EVERY_S = 60.0  # freeze what the minute's caches added to generation 2
FULL_EVERY_S = 600.0  # collect what those freezes kept (cycles that died meanwhile)
NO_AUTOMATIC_FULL = 1 << 30  # gc's third threshold: full collections only by Freezer
# a due freeze waits for a moment no reader is due; this long at most (many readers,
# no gap wide enough): then it is taken anyway
MAX_WAIT_S = 120.0
SAFETY = 1.5  # the expected pause: the last one of its kind, times this


class Freezer:
    """When the daemon's loop freezes: a full refreeze after a detach and every
    FULL_EVERY_S; a young one at start-up, after an attach and every YOUNG_EVERY_S.  Either
    waits until no HTTP reader (Prometheus, a poller) is due within the pause it
    expects, from `ScrapeClock`, so a pause and a scrape rarely meet."""

    def __init__(self, pauses: GcPauses, clock: ScrapeClock) -> None:
        """Python's own full collections are turned off while it runs: after a freeze
        they came every few seconds (its "25 % more long-lived objects" rule counts
        from the few left unfrozen): 104 in 7 minutes of soak, 10 of them 50 ms or
        more of CPU."""
        self.pauses = pauses
        self.clock = clock
        self._thresholds = gc.get_threshold()
        gc.set_threshold(self._thresholds[0], self._thresholds[1], NO_AUTOMATIC_FULL)
        # start-up: a young freeze at once (milliseconds: the capture loop's first polls
        # must not wait), the first full one after FULL_EVERY_S or a detach
        self.full_due, self.young_due = False, True
        self._next_full = time.monotonic() + FULL_EVERY_S
        self._next_young = 0.0
        self._due_since: float | None = None
        self.expected = {"full": 0.3, "young": 0.05}  # seconds, until one is measured

    def tick(self) -> None:
        now = time.monotonic()
        full = self.full_due or now >= self._next_full
        if not (full or self.young_due or now >= self._next_young):
            self._due_since = None
            return
        kind = "full" if full else "young"
        self._due_since = now if self._due_since is None else self._due_since
        if not self.clock.clear_for(self.expected[kind] * SAFETY, now):
            if now - self._due_since < MAX_WAIT_S:
                return
            self.pauses.forced += 1
        started = time.perf_counter()
        self.pauses.frozen = refreeze() if full else freeze_new()
        self.expected[kind] = time.perf_counter() - started
        if full:
            self._next_full = now + FULL_EVERY_S
        self.full_due = self.young_due = False
        self._next_young = now + YOUNG_EVERY_S
        self._due_since = None

    def close(self) -> None:
        """Python's thresholds back (an in-process caller: tests)."""
        gc.set_threshold(*self._thresholds)
