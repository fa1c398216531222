"""One walk of a map for every exited process that waits for its report.

A batch read of a hash map visits every bucket: the object map has a million by
default (about 4 ms a walk here, however few objects it holds) and the stack
owners' map a quarter of a million.  A fork-heavy CI run (200 processes, 8 leaks
each) spent 70 % of its report worker in those walks, one of each per process
(issue 43).  An exited process's entries no longer change (they are keyed by its
generation), so when several exited processes wait for their reports, the first
drain reads the entries of all of them and keeps each one's until its report asks.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

Pair = tuple[int, int]  # (tgid, generation)
T = TypeVar("T")


class Ahead(Generic[T]):
    """Exited processes announced by the capture thread, and what one walk read for
    them; the report worker takes each process's share once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[Pair] = set()
        self._read: dict[Pair, T] = {}

    def expect(self, pair: Pair) -> None:
        with self._lock:
            self._waiting.add(pair)

    def take(self, pair: Pair) -> T | None:
        """What a walk already read for `pair` (removed), or None."""
        with self._lock:
            return self._read.pop(pair, None)

    def batch(self, pair: Pair) -> set[Pair]:
        """The processes the walk for `pair` should read: every one waiting, when `pair`
        is among them and is not alone (alone, the plain walk of one process is used)."""
        with self._lock:
            if pair not in self._waiting or len(self._waiting) < 2:
                self._waiting.discard(pair)
                return set()
            wanted, self._waiting = self._waiting, set()
            return wanted

    def keep(self, found: dict[Pair, T]) -> None:
        with self._lock:
            self._read.update(found)


def rows_by_process(tgids: memoryview, gens: memoryview, wanted: set[Pair]
                    ) -> dict[Pair, list[int]]:
    """Row numbers of each wanted (tgid, gen) among one batch's rows: numpy picks the
    rows, so a batch of other processes' objects costs no Python loop."""
    import numpy as np
    both = (np.asarray(tgids).astype(np.uint64) << np.uint64(32)) | \
        np.asarray(gens).astype(np.uint64)
    want = np.array(sorted((t << 32) | g for t, g in wanted), dtype=np.uint64)
    rows = np.nonzero(np.isin(both, want))[0]
    out: dict[Pair, list[int]] = {}
    for row, value in zip(rows.tolist(), both[rows].tolist(), strict=True):
        out.setdefault((value >> 32, value & 0xFFFFFFFF), []).append(row)
    return out
