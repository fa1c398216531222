"""Read a live process's memory where a file is mapped (USDT semaphores).

Read-only: refcntd never writes a semaphore; the kernel owns it (uprobe
ref_ctr_offset).
"""

from __future__ import annotations

import os
from pathlib import Path


def mapped_address(pid: int, path: str, file_offset: int, proc: Path = Path("/proc")
                   ) -> int | None:
    """The address where `file_offset` of `path` is mapped writable in `pid`, if it is."""
    target = os.stat(path)
    try:
        lines = (proc / str(pid) / "maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or "w" not in fields[1]:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        offset, inode = int(fields[2], 16), int(fields[4])
        if inode == target.st_ino and offset <= file_offset < offset + (end - start):
            return start + file_offset - offset
    return None


def read_u16(pid: int, address: int, proc: Path = Path("/proc")) -> int | None:
    try:
        with open(proc / str(pid) / "mem", "rb") as mem:
            mem.seek(address)
            data = mem.read(2)
    except OSError:
        return None
    return int.from_bytes(data, "little") if len(data) == 2 else None


def read_string(pid: int, address: int, limit: int = 64, proc: Path = Path("/proc")
                ) -> str | None:
    """A NUL-terminated string from a live process (type names for metrics)."""
    try:
        with open(proc / str(pid) / "mem", "rb") as mem:
            mem.seek(address)
            data = mem.read(limit)
    except (OSError, OverflowError, ValueError):
        return None
    if b"\0" not in data:
        return None
    return data.split(b"\0", 1)[0].decode(errors="replace") or None


def semaphore_value(pid: int, path: str, file_offset: int) -> int | None:
    address = mapped_address(pid, path, file_offset)
    return None if address is None else read_u16(pid, address)
