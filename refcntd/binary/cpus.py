"""How many CPUs the analysis may use for itself: those this process may run on,
minus those its own background work keeps busy (attach's BPF compile runs beside
the analysis; a sweep forking a worker for that CPU would only slow both)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_busy = 0
_lock = threading.Lock()


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Around work another thread runs beside the analysis."""
    global _busy
    with _lock:
        _busy += 1
    try:
        yield
    finally:
        with _lock:
            _busy -= 1


def free() -> int:
    return max(1, len(os.sched_getaffinity(0)) - _busy)
