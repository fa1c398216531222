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
from bisect import bisect_right
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

CHUNK = 1 << 22  # bytes per read: the scan holds a few of these at a time, never a heap
SNAP_MAPPING = 1 << 20  # a writable mapping up to this size is read with the others at once
SNAP_TOTAL = 8 << 20  # ... while they add up to at most this
IOV_MAX = 1024  # remote ranges per process_vm_readv
GATHER_GAP, GATHER_SPAN = 1 << 14, 1 << 22  # gather: words this close share one read


class Mapping(NamedTuple):
    """One line of /proc/PID/maps (a tuple: made ~30 times per held process, where a
    frozen dataclass's __init__ was most of read_maps)."""

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
        with open(f"{proc}/{pid}/maps", "rb") as f:
            text = f.read().decode(errors="surrogateescape")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        start, _, end = fields[0].partition("-")
        path = fields[5].strip() if len(fields) == 6 else ""
        out.append(Mapping(int(start, 16), int(end, 16), fields[1], int(fields[2], 16),
                           int(fields[4]), path))
    return out


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class ProcessMemory:
    """Reads of one process; `bytes_read` is what the scan cost in memory traffic."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.pid = pid
        self.bytes_read = 0
        self.reads = 0  # system calls made: the fixed cost of a small process's scan
        self._vm_readv = _vm_readv()
        self._mem_path = proc / str(pid) / "mem"
        self._mem: int | None = None
        self._window = np.empty(0, np.uint64)
        self._copied: list[tuple[int, int, np.ndarray]] = []  # (start, end, its bytes)
        self._copied_starts: list[int] = []
        self.detached = False  # only the copy is read: the process runs again

    def snapshot(self, maps: list[Mapping]) -> None:
        """Read the small writable mappings (up to SNAP_MAPPING each, SNAP_TOTAL in all)
        in one call: a short-lived process's scan is a dozen small reads of them, each
        a system call and its Python around it, while the process waits.  Later reads
        inside them are served from here; the others read the process as before."""
        ranges, total = [], 0
        for m in maps:
            if m.writable and m.size <= SNAP_MAPPING and total + m.size <= SNAP_TOTAL:
                ranges.append((m.start, m.end))
                total += m.size
        if self._vm_readv is None or not ranges:
            return
        into = np.empty(total, np.uint8)
        got = _readv_many(self._vm_readv, self.pid, into, ranges[:IOV_MAX])
        self.reads += 1
        self.bytes_read += max(got, 0)
        offset = 0
        for start, end in ranges[:IOV_MAX]:
            kept = min(end - start, max(got - offset, 0)) & ~7
            if kept:
                self.keep(start, into[offset:offset + kept])
            offset += end - start

    def copy(self, ranges: list[tuple[int, int]], into: np.ndarray | None = None
             ) -> list[tuple[int, int]]:
        """Copy [start, end) ranges (in address order, page-aligned) into `into` (bytes,
        at least their total; prepared by the caller, its pages faulted in before the
        process was stopped) or a new array, IOV_MAX ranges a call.  Returns the ranges
        (or their tails) that could not be read (a VM_IO mapping, gone): not kept."""
        total = sum(end - start for start, end in ranges)
        if self._vm_readv is None:
            return list(ranges)
        if into is not None and len(into) < total:  # what fits there, the rest in a new one
            fit, room = 0, len(into)
            while fit < len(ranges) and ranges[fit][1] - ranges[fit][0] <= room:
                room -= ranges[fit][1] - ranges[fit][0]
                fit += 1
            return self.copy(ranges[:fit], into) + self.copy(ranges[fit:])
        into = np.empty(total, np.uint8) if into is None else into
        missed: list[tuple[int, int]] = []
        offset, todo = 0, list(ranges)
        while todo:
            part = todo[:IOV_MAX]
            size = sum(end - start for start, end in part)
            got = _readv_many(self._vm_readv, self.pid, into[offset:offset + size], part)
            self.reads += 1
            self.bytes_read += max(got, 0)
            done = self._kept_of(part, into[offset:], max(got, 0), missed)
            offset += sum(end - start for start, end in part[:done])
            todo = todo[done:]
        return missed

    def _kept_of(self, part: list[tuple[int, int]], into: np.ndarray, got: int,
                 missed: list[tuple[int, int]]) -> int:
        """Keep what one call read of `part`; the range it stopped in is given up from
        there (in `missed`).  Returns how many ranges are done."""
        offset = 0
        for i, (start, end) in enumerate(part):
            kept = min(end - start, max(got - offset, 0))
            if kept:
                self.keep(start, into[offset:offset + kept])
            if kept < end - start:
                missed.append((start + kept, end))
                return i + 1
            offset += end - start
        return len(part)

    def recopy(self, ranges: list[tuple[int, int]]) -> None:
        """Copy [start, end) ranges, each inside one span copied before, again into
        their place there (the pages written since), IOV_MAX a call."""
        pairs = [(a, b, view) for a, b in ranges if (view := self._cached(a, b - a)) is not None]
        for i in range(0, len(pairs), IOV_MAX):
            part = pairs[i:i + IOV_MAX]
            local = (_IoVec * len(part))(*(_IoVec(v.ctypes.data, b - a) for a, b, v in part))
            remote = (_IoVec * len(part))(*(_IoVec(a, b - a) for a, b, _ in part))
            got = self._vm_readv(self.pid, local, len(part), remote, len(part), 0)
            self.reads += 1
            self.bytes_read += max(got, 0)

    def keep(self, start: int, data: np.ndarray) -> None:
        """Serve reads of [start, start + len(data)) from `data` (bytes), joined to the
        span before it when it follows it in both the process and memory."""
        end = start + (len(data) & ~7)
        if end <= start:
            return
        data = data[: end - start]
        if self._copied and self._copied[-1][1] == start and start > self._copied[-1][0]:
            first, _, prev = self._copied[-1]
            base = prev.base
            if isinstance(base, np.ndarray) and data.base is base and \
                    prev.ctypes.data + len(prev) == data.ctypes.data:
                at = prev.ctypes.data - base.ctypes.data
                self._copied[-1] = (first, end, base[at: at + end - first])
                return
        at = bisect_right(self._copied_starts, start)
        self._copied.insert(at, (start, end, data))
        self._copied_starts.insert(at, start)

    def copied(self) -> list[tuple[int, int]]:
        """The spans served from copies, in address order."""
        return [(start, end) for start, end, _ in self._copied]

    def copied_view(self, start: int, end: int) -> np.ndarray | None:
        """The kept bytes of [start, end), writable (a pre-copy's pages written since are
        copied again into them), None unless one span has them all."""
        return self._cached(start, end - start)

    def _cached(self, address: int, size: int) -> np.ndarray | None:
        """The bytes of [address, address + size) from the copies, when one has them all
        (a read across its end goes to the process: it may go on into a mapping the
        snapshot left out)."""
        i = bisect_right(self._copied_starts, address) - 1
        if i < 0:
            return None
        start, end, data = self._copied[i]
        if address + size > end:
            return None
        return data[address - start: address - start + size]

    def _from_copy(self, address: int, size: int) -> np.ndarray:
        """Detached: what the copies have of the range from its start on (a read that
        runs past a copied span ends there, as at the end of a mapping)."""
        i = bisect_right(self._copied_starts, address) - 1
        if i < 0 or address >= self._copied[i][1]:
            return np.zeros(0, np.uint8)
        start, end, data = self._copied[i]
        return data[address - start: min(address + size, end) - start]

    def close(self) -> None:
        self._copied, self._copied_starts = [], []
        if self._mem is not None:
            os.close(self._mem)
            self._mem = None

    def read(self, address: int, size: int) -> bytes:
        """Up to `size` bytes at `address`: shorter when the range ends in unmapped memory
        (the process unmapped it since maps was read), b"" when nothing is readable."""
        if (cached := self._cached(address, size)) is not None:
            return cached.tobytes()
        if self.detached:
            return self._from_copy(address, size).tobytes()
        self.reads += 1
        data = self._readv(address, size)
        if data is None:
            data = self._read_mem(address, size)
        self.bytes_read += len(data)
        return data

    def words_at(self, address: int, size: int, reuse: bool = False) -> np.ndarray:
        """The aligned words of up to `size` bytes at `address`, read straight into a
        numpy array (no copy): what the pointer scan reads.  `reuse`: into one buffer
        kept for the next window (valid until the next such read: a heap read in
        fresh arrays spent a page fault per 4 KiB).  Read-only: a snapshot's words may
        be handed out."""
        if address % 8 == 0 and (cached := self._cached(address, size & ~7)) is not None:
            return cached.view(np.uint64)
        if self.detached:
            part = self._from_copy(address, size & ~7)
            return part[: len(part) & ~7].view(np.uint64) if address % 8 == 0 else \
                np.frombuffer(part[: len(part) & ~7].tobytes(), np.uint64)
        self.reads += 1
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

    def gather(self, addresses: list[int]) -> list[int | None]:
        """The word at each address (None where it cannot be read).  Addresses close
        together (GATHER_GAP) are read as one range of up to GATHER_SPAN bytes: objects
        on one heap are a few reads, where a remote range each cost ~9 us of page
        pinning (5 000 objects: 57 ms in 1 024-range calls, 3 ms so)."""
        if not addresses:
            return []
        where = np.array(addresses, np.uint64)
        order = np.argsort(where, kind="stable")
        ranked = where[order]
        values = np.zeros(len(where), np.uint64)
        read = np.zeros(len(where), bool)
        cuts = np.flatnonzero(np.diff(ranked) > GATHER_GAP) + 1
        for part in np.split(np.arange(len(ranked)), cuts):
            base = int(ranked[part[0]])
            for span in np.split(part, np.flatnonzero(np.diff(
                    (ranked[part] - np.uint64(base)) // np.uint64(GATHER_SPAN))) + 1):
                self._gather_span(ranked, span, values, read)
        out: list[int | None] = [None] * len(where)
        for rank, (value, ok) in enumerate(zip(values.tolist(), read.tolist(), strict=True)):
            if ok:
                out[int(order[rank])] = value
        return out

    def _gather_span(self, ranked: np.ndarray, span: np.ndarray, values: np.ndarray,
                     read: np.ndarray) -> None:
        """One read for the sorted addresses `span` indexes; past a short read (memory
        unmapped meanwhile), or unaligned, one word each."""
        start = int(ranked[span[0]])
        data = self.read(start, int(ranked[span[-1]]) + 8 - start)
        offsets = ranked[span] - np.uint64(start)
        fits = (offsets % np.uint64(8) == 0) & (offsets + np.uint64(8) <= np.uint64(len(data)))
        words = np.frombuffer(data, np.uint64, len(data) // 8)
        values[span[fits]] = words[(offsets[fits] // np.uint64(8)).astype(np.int64)]
        read[span[fits]] = True
        for i in span[~fits].tolist():
            word = self.word(int(ranked[i]))
            if word is not None:
                values[i], read[i] = word, True

    def words(self, address: int, count: int) -> list[int] | None:
        data = self.read(address, 8 * count)
        if len(data) != 8 * count:
            return None
        return [int.from_bytes(data[i:i + 8], "little") for i in range(0, len(data), 8)]


@cache
def _vm_readv() -> Any:
    """libc's process_vm_readv, loaded once (None where libc lacks it)."""
    return getattr(ctypes.CDLL(None, use_errno=True), "process_vm_readv", None)


def _readv_many(call: Any, pid: int, into: np.ndarray, ranges: list[tuple[int, int]]) -> int:
    """[start, end) ranges of `pid` read one after another into `into`: the bytes read
    (the kernel stops at the first range it cannot read), -1 on failure."""
    remote = (_IoVec * len(ranges))(*(_IoVec(a, b - a) for a, b in ranges))
    local = _IoVec(into.ctypes.data, into.nbytes)
    got: int = call(pid, ctypes.byref(local), 1, remote, len(ranges), 0)
    return got
