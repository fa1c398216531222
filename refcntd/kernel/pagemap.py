"""Which pages of a stopped process changed since its soft-dirty bits were cleared.

Two ways to ask /proc/PID/pagemap (Documentation/admin-guide/mm/pagemap.rst):
* the PAGEMAP_SCAN ioctl (Linux 6.7; PAGE_IS_SOFT_DIRTY since 6.8): the kernel walks
  the page tables and returns only the runs of pages that match, 0.8 ms for 1 GiB of
  clean pages here where
* reading 8 bytes a page (bit 55 soft-dirty, 62 swapped, 63 present) took 24-40 ms.
reach/livecopy.py asks for the pages written since (soft-dirty) and for those no longer
there (neither present nor swapped: released with MADV_DONTNEED, zero if anonymous).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import mmap
import os
from functools import cache
from typing import Any

import numpy as np

PAGE = 4096
PM_SOFT_DIRTY, PM_FILE, PM_SWAPPED, PM_PRESENT = 1 << 55, 1 << 61, 1 << 62, 1 << 63
PM_PFN = (1 << 55) - 1
PAGE_IS_FILE, PAGE_IS_PRESENT, PAGE_IS_SWAPPED = 1 << 2, 1 << 3, 1 << 4
PAGE_IS_PFNZERO, PAGE_IS_SOFT_DIRTY = 1 << 5, 1 << 7
REGIONS = 4096  # page_region entries an ioctl fills; the walk goes on from walk_end


class _ScanArg(ctypes.Structure):
    """struct pm_scan_arg (include/uapi/linux/fs.h)."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


PAGEMAP_SCAN = (3 << 30) | (ctypes.sizeof(_ScanArg) << 16) | (ord("f") << 8) | 16  # _IOWR


@cache
def _ioctl() -> Any:
    return ctypes.CDLL(None, use_errno=True).ioctl


Runs = list[tuple[int, int]]


def changed(fd: int, start: int, end: int, use_scan: bool, file: bool
            ) -> tuple[Runs, Runs] | None:
    """Of [start, end) since the soft-dirty bits were cleared: (runs to copy again, runs
    that read as zeros).  Written pages (soft-dirty) are copied again.  A page released
    (MADV_DONTNEED) is no write: it is neither present nor swapped, or, read since, the
    zero page; in an anonymous mapping both read as zeros.  In a file's mapping such a
    page reads as the file again, as may any page of the file: those are copied again.
    By the ioctl where `use_scan` and the kernel takes it, else from the entries; None
    when the entries hide the frame numbers (no CAP_SYS_ADMIN), which tell the zero
    page."""
    if use_scan:
        found = [scan(fd, start, end, anyof=PAGE_IS_SOFT_DIRTY),
                 scan(fd, start, end, mask=PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                      inverted=PAGE_IS_PRESENT | PAGE_IS_SWAPPED),
                 scan(fd, start, end, anyof=PAGE_IS_FILE if file else PAGE_IS_PFNZERO)]
        if all(f is not None for f in found):
            dirty, gone, other = (f or [] for f in found)
            return (sorted(dirty + gone + other), []) if file else (dirty, sorted(gone + other))
    zero = zero_pfn()
    if zero is None:
        return None
    entries = np.frombuffer(os.pread(fd, (end - start) // PAGE * 8, start // PAGE * 8),
                            np.uint64)
    dirty = (entries & np.uint64(PM_SOFT_DIRTY)) != 0
    gone = (entries & np.uint64(PM_PRESENT | PM_SWAPPED)) == 0
    if file:
        return _runs(start, dirty | gone | ((entries & np.uint64(PM_FILE)) != 0)), []
    zeros = gone | (((entries & np.uint64(PM_PRESENT)) != 0)
                    & ((entries & np.uint64(PM_PFN)) == np.uint64(zero)))
    return _runs(start, dirty), _runs(start, zeros)  # zeroed, then those written copied


@cache
def zero_pfn() -> int | None:
    """The zero page's frame number, as this process's pagemap shows a page only read
    (None where frame numbers are hidden: 0 without CAP_SYS_ADMIN)."""
    area = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area[0]  # a read fault maps the zero page
        address = ctypes.addressof(ctypes.c_char.from_buffer(area))
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(address // PAGE * 8)
            entry = int.from_bytes(f.read(8), "little")
    finally:
        gc.collect()  # the from_buffer export must go before close
        with contextlib.suppress(BufferError):
            area.close()
    pfn = entry & PM_PFN
    return pfn if entry & PM_PRESENT and pfn else None


def scan(fd: int, start: int, end: int, mask: int = 0, inverted: int = 0, anyof: int = 0
         ) -> Runs | None:
    """The runs of pages matching (every category of `mask`, any of `anyof`, each
    of `inverted` negated), None where the kernel has no such ioctl or category."""
    vec = (ctypes.c_uint64 * (3 * REGIONS))()
    out: Runs = []
    while start < end:
        arg = _ScanArg(ctypes.sizeof(_ScanArg), 0, start, end, 0, ctypes.addressof(vec),
                       REGIONS, 0, inverted, mask, anyof, mask | anyof)
        got = _ioctl()(fd, PAGEMAP_SCAN, ctypes.byref(arg))
        if got < 0:
            if ctypes.get_errno() in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP):
                return None
            raise OSError(ctypes.get_errno(), "PAGEMAP_SCAN")
        out += [(vec[3 * i], vec[3 * i + 1]) for i in range(got)]
        if arg.walk_end <= start:
            break
        start = arg.walk_end
    return out


def _runs(start: int, flags: np.ndarray) -> Runs:
    """[a, b) address runs of the pages from `start` where `flags` is true."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], flags.astype(np.int8), [0]))))
    return [(start + a * PAGE, start + b * PAGE)
            for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True)]


def scan_works() -> bool:
    """Whether PAGEMAP_SCAN takes PAGE_IS_SOFT_DIRTY (6.8+): asked of this process."""
    fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        return scan(fd, 0, PAGE, anyof=PAGE_IS_SOFT_DIRTY) is not None
    except OSError:
        return False
    finally:
        os.close(fd)
