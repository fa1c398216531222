"""serve's glibc malloc settings (service/malloc.py), observed in a fresh process (a
long-lived one may serve the block from a freed chunk that fits, which is fine)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import ctypes
from refcntd.service import malloc


class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
                "keepcost".split()]


libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Mallinfo2
if FIXED:
    malloc.limit_arenas()
libc.free(libc.malloc(4 << 20))  # mmapped, and freed: glibc's rule's trigger
before = libc.mallinfo2().hblks
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblks - before)
"""


def _mmapped(fixed: bool) -> int:
    out = subprocess.run([sys.executable, "-c", f"FIXED = {fixed}\n" + PROBE], check=True,
                         capture_output=True, text=True).stdout
    return int(out)


def test_big_blocks_stay_mmapped_after_a_bigger_one_is_freed():
    """glibc's own rule raises the mmap threshold to each freed mmapped block's size,
    so after a tracer's 4 MiB buffers are freed a 1 MiB one comes from the arena and
    stays there as free space; with the threshold fixed it is mmapped (and unmapped
    when freed)."""
    assert _mmapped(fixed=False) == 0  # glibc's own rule, as the fix's premise says
    assert _mmapped(fixed=True) == 1
