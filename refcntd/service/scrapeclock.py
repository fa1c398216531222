"""When the next HTTP reader of `serve` is due: so a garbage-collector pause can be
placed where no scrape will meet it.

A scrape that arrives during a full collection waits for it (hundreds of ms with
a few hundred thousand objects).  "Just after a scrape" is a good moment only while
one client scrapes: in the hour's soak (benchmarks/results/soak.md) a once-a-minute
reader of /metrics made that moment fall just before Prometheus's next scrape.
Prometheus (and most pollers) read at a fixed interval, so each reader's next
request is predictable from its last few: a reader is its address, User-Agent and
path, its period the median of its last intervals.  A reader that stopped (no request
for three periods) or has not shown a period yet is not waited for.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

INTERVALS = 5  # a reader's period: the median of its last few intervals
STALE_PERIODS = 3.0  # silent this many periods: it stopped (or moved), not waited for
MARGIN_S = 0.1  # a reader's jitter, and the time the pause's own start takes
MAX_READERS = 64  # bounded: readers are few (Prometheus replicas, an operator's poll)


@dataclass
class _Reader:
    last: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=INTERVALS))

    def period(self) -> float | None:
        return statistics.median(self.intervals) if len(self.intervals) >= 2 else None


class ScrapeClock:
    """Fed by the HTTP server's threads (`started`/`ended`), read by the daemon's loop
    (`clear_for`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers: dict[tuple[str, str, str], _Reader] = {}
        self._in_flight = 0

    def started(self, address: str, agent: str, path: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        key = (address, agent, path)
        with self._lock:
            self._in_flight += 1
            reader = self._readers.get(key)
            if reader is None:
                if len(self._readers) >= MAX_READERS:
                    self._forget_oldest()
                self._readers[key] = _Reader(now)
                return
            reader.intervals.append(now - reader.last)
            reader.last = now

    def ended(self) -> None:
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)

    def clear_for(self, seconds: float, now: float | None = None) -> bool:
        """No request in progress, and no reader due within `seconds` (plus margin)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._in_flight:
                return False
            return all(self._clear(reader, now, seconds) for reader in self._readers.values())

    @staticmethod
    def _clear(reader: _Reader, now: float, seconds: float) -> bool:
        period = reader.period()
        if period is None or now - reader.last > STALE_PERIODS * period:
            return True
        # due at last + period; overdue counts as due now
        return reader.last + period - now > seconds + MARGIN_S

    def _forget_oldest(self) -> None:
        oldest = min(self._readers, key=lambda key: self._readers[key].last)
        del self._readers[oldest]
