"""serve's glibc malloc settings (service/malloc.py), observed in this process."""

from __future__ import annotations

import ctypes

from refcntd.service import malloc


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost".split()]


def test_big_blocks_stay_mmapped_after_a_bigger_one_is_freed():
    """glibc's own rule raises the mmap threshold to each freed mmapped block's size,
    so after a tracer's 4 MiB buffers are freed a 1 MiB one would come from the arena
    and stay there as free space; fixed, it is mmapped (and unmapped when freed)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = _Mallinfo2
    malloc.limit_arenas()
    libc.free(libc.malloc(4 << 20))  # mmapped, and freed: the rule's trigger
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 20)
    try:
        assert libc.mallinfo2().hblks == before + 1
    finally:
        libc.free(block)
