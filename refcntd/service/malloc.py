"""glibc malloc settings for a daemon that runs for months.

In the soak (issue 43) serve's RSS grew while Python held a bounded amount
(tracemalloc: ~400 bytes per reported process, bounded caches): the rest was
memory glibc had been given back by free() and kept, in up to 8 arenas per CPU,
one per thread that happened to contend (the capture loop, a report worker per
tracer, a thread per HTTP request).  Two arenas bound that spread, and trimming
on a timer hands freed pages back to the kernel.  Elsewhere (musl) these calls
do not exist and nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("refcntd")
M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_arenas() -> None:
    """Before the daemon starts its threads: at most ARENAS malloc arenas."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt") and not libc.mallopt(M_ARENA_MAX, ARENAS):
        log.debug("mallopt(M_ARENA_MAX) refused: malloc arenas not limited")


def trim() -> None:
    """Return the free pages of every arena to the kernel (a few ms)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
