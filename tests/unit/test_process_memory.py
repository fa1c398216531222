"""ProcessMemory.snapshot on this very process (no root needed to read oneself): what
it read is served from it, what it could not read is read as before, and a read
across two mappings read whole is served whole."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from refcntd.reach import memory
from refcntd.reach.memory import Mapping, ProcessMemory

PAGE = mmap.PAGESIZE


def pages(count: int) -> tuple[mmap.mmap, int]:
    area = mmap.mmap(-1, count * PAGE)
    for i in range(count):
        area[i * PAGE:(i + 1) * PAGE] = bytes([0x41 + i]) * PAGE
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    return area, address


def rw(start: int, end: int) -> Mapping:
    return Mapping(start, end, "rw-p", 0, 0, "")


def test_what_the_snapshot_could_not_read_is_read_as_before() -> None:
    area, base = pages(3)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + PAGE), PAGE, 0) == 0  # a hole: PROT_NONE
    mem = ProcessMemory(os.getpid())
    mem.snapshot([rw(base, base + PAGE), rw(base + PAGE, base + 2 * PAGE),
                  rw(base + 2 * PAGE, base + 3 * PAGE)])
    assert mem.reads == 1
    assert mem.read(base + 8, 8) == b"A" * 8 and mem.reads == 1  # from the snapshot
    assert mem.read(base + 2 * PAGE, 8) == b"C" * 8 and mem.reads == 2  # stopped at the hole
    assert mem.read(base + PAGE, 8) == b""  # the hole itself: nothing, as before
    assert mem.read(base + PAGE - 8, 16) == b"A" * 8  # up to the hole, as before
    libc.mprotect(ctypes.c_void_p(base + PAGE), PAGE, mmap.PROT_READ | mmap.PROT_WRITE)
    area.close()


def test_adjacent_mappings_read_whole_are_one_span() -> None:
    area, base = pages(2)
    mem = ProcessMemory(os.getpid())
    mem.snapshot([rw(base, base + PAGE), rw(base + PAGE, base + 2 * PAGE)])
    words = mem.words_at(base + PAGE - 16, 32)
    assert words.tobytes() == b"A" * 16 + b"B" * 16 and mem.reads == 1
    area[0:8] = b"changed!"  # served from the snapshot: what it was when read
    assert mem.read(base, 8) == b"A" * 8
    area.close()


def test_large_mappings_are_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    area, base = pages(2)
    mem = ProcessMemory(os.getpid())
    monkeypatch.setattr(memory, "SNAP_MAPPING", PAGE)
    mem.snapshot([rw(base, base + 2 * PAGE)])
    assert mem.reads == 0
    assert mem.read(base + PAGE, 4) == b"BBBB" and mem.reads == 1
    area.close()
