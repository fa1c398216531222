"""A traced process's address space, read and never written.

`process_vm_readv(2)` copies from the target without stopping it or changing what it
sees (no ptrace attach); /proc/PID/mem is the fallback where that call is refused
(a kernel built without CONFIG_CROSS_MEMORY_ATTACH).  Both need the same permission
as ptrace's read mode: refcntd runs as root or as the target's user.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHUNK = 1 << 22  # bytes per read: the scan holds a few of these at a time, never a heap


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str  # "" for an anonymous mapping; "[heap]", "[stack]", a file ...

    @property
    def writable(self) -> bool:
        return self.perms.startswith("rw")

    @property
    def size(self) -> int:
        return self.end - self.start


def read_maps(pid: int, proc: Path = Path("/proc")) -> list[Mapping]:
    """The mappings, in address order; [] when the process is gone."""
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        path = fields[5].strip() if len(fields) == 6 else ""
        out.append(Mapping(start, end, fields[1], int(fields[2], 16), int(fields[4]), path))
    return out


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class ProcessMemory:
    """Reads of one process; `bytes_read` is what the scan cost in memory traffic."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.pid = pid
        self.bytes_read = 0
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._vm_readv = getattr(self._libc, "process_vm_readv", None)
        self._mem_path = proc / str(pid) / "mem"
        self._mem: int | None = None
        self._window = np.empty(0, np.uint64)

    def close(self) -> None:
        if self._mem is not None:
            os.close(self._mem)
            self._mem = None

    def read(self, address: int, size: int) -> bytes:
        """Up to `size` bytes at `address`: shorter when the range ends in unmapped memory
        (the process unmapped it since maps was read), b"" when nothing is readable."""
        data = self._readv(address, size)
        if data is None:
            data = self._read_mem(address, size)
        self.bytes_read += len(data)
        return data

    def words_at(self, address: int, size: int, reuse: bool = False) -> np.ndarray:
        """The aligned words of up to `size` bytes at `address`, read straight into a
        numpy array (no copy): what the pointer scan reads.  `reuse`: into one buffer
        kept for the next window (valid until the next such read: a heap read in
        fresh arrays spent a page fault per 4 KiB)."""
        if reuse and len(self._window) < size // 8:
            self._window = np.empty(size // 8, np.uint64)
        out = self._window[: size // 8] if reuse else np.empty(size // 8, np.uint64)
        got = -1
        if self._vm_readv is not None:
            local = _IoVec(out.ctypes.data, out.nbytes)
            remote = _IoVec(address, out.nbytes)
            got = self._vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got < 0:
            data = self._read_mem(address, out.nbytes)
            got = len(data)
            out[: got // 8] = np.frombuffer(data[: got & ~7], np.uint64)
        self.bytes_read += max(got, 0)
        return out[: max(got, 0) // 8]

    def _readv(self, address: int, size: int) -> bytes | None:
        if self._vm_readv is None:
            return None
        buf = ctypes.create_string_buffer(size)
        local = _IoVec(ctypes.cast(buf, ctypes.c_void_p), size)
        remote = _IoVec(address, size)
        got = self._vm_readv(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got < 0:
            err = ctypes.get_errno()
            return b"" if err in (errno.EFAULT, errno.ESRCH) else None
        return buf.raw[:got]

    def _read_mem(self, address: int, size: int) -> bytes:
        try:
            if self._mem is None:
                self._mem = os.open(self._mem_path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(self._mem, size, address)
        except OSError:
            return b""

    def word(self, address: int) -> int | None:
        data = self.read(address, 8)
        return int.from_bytes(data, "little") if len(data) == 8 else None

    def words(self, address: int, count: int) -> list[int] | None:
        data = self.read(address, 8 * count)
        if len(data) != 8 * count:
            return None
        return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]
