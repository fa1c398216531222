"""glibc malloc settings for a daemon that runs for months.

In the soak (issue 43) serve's RSS grew while Python held a bounded amount
(tracemalloc: ~400 bytes per reported process, bounded caches): the rest was
memory glibc had been given back by free() and kept, in up to 8 arenas per CPU,
one per thread that happened to contend (the capture loop, a report worker per
tracer, a thread per HTTP request).  Two arenas bound that spread, and trimming
on a timer hands freed pages back to the kernel.  Elsewhere (musl) these calls
do not exist and nothing changes.

A fixed mmap threshold: glibc raises its threshold to the size of each mmapped
block freed (up to 32 MiB), so after the first tracer's ELF and DWARF buffers
were freed the next ones came from the arena, and stayed there as free space a
trim could only partly return. With the threshold fixed, blocks of 256 KiB and
more that no free chunk of the arena fits are mmapped, and unmapped on free:
over eight reload cycles of a target, glibc's arena grew 17 -> 37 MiB before and
16 -> 20 MiB after, and RSS rose 16.7 MiB before and 11.3 MiB after (the rest is
pymalloc's arenas, which a few long-lived objects made during a tracer's life
keep), flat from the second cycle on either way.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("refcntd")
M_ARENA_MAX = -8  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
ARENAS = 2
MMAP_THRESHOLD = 256 << 10


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def limit_arenas() -> None:
    """Before the daemon starts its threads: at most ARENAS malloc arenas, and big
    blocks always mmapped."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    for param, value, what in ((M_ARENA_MAX, ARENAS, "malloc arenas not limited"),
                               (M_MMAP_THRESHOLD, MMAP_THRESHOLD, "mmap threshold not fixed")):
        if not libc.mallopt(param, value):
            log.debug("mallopt(%d) refused: %s", param, what)


def trim() -> None:
    """Return the free pages of every arena to the kernel (a few ms)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
