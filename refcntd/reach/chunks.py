"""glibc malloc's chunk headers walked with numpy, a window of words at a time.

A run of chunks is a chain: each header's size leads to the next one.  Following it
one Python step per chunk cost seconds per million blocks, so each window is done
in bulk: every 16-byte slot whose size word could be a header (at least 32, a
multiple of 16, inside the region) is a candidate, pointing at the slot its size
leads to.  The chain from the window's first chunk is what remains once candidates
nothing points at are dropped, round after round (in a chain whose steps only go
forward, what is left then is reachable from the first chunk, and only that).  User
data that looks like headers makes short false chains, gone in a round or two; a
window still not settled after PRUNE_ROUNDS is solved by pointer doubling.

That is still about 0.5 us a chunk, spent while the process is stopped: where
scripts/setup.sh built the compiled walker (chunkwalk.c, a few ns a chunk), the chain
is followed by it, and its absence is said in the scan's notes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from refcntd.reach.memory import ProcessMemory

PREV_INUSE = 1
HEAP_MAX = 64 << 20  # HEAP_MAX_SIZE on 64-bit: thread arenas' heaps are aligned to it
WINDOW = 1 << 20  # bytes read at a time: the walk holds one window, never a heap
PRUNE_ROUNDS = 3
TAIL_SLACK = 4096  # the main heap's top chunk may end within the page before brk
_OFFSETS = np.arange(WINDOW // 16, dtype=np.uint64) * np.uint64(16)
_SIZE_MASK = np.uint64(0xFFFF_FFFF_FFFF_FFF8)
COMPILED = Path(__file__).with_name("_chunkwalk.so")
COMPILED_VERSION = 3  # CHUNKWALK_VERSION in chunkwalk.c
FASTBIN_WINDOWS, FASTBIN_WINDOW = 1024, 64 << 10  # refcntd_fastbins' read cache (64 MiB
# of address space; a page is only memory once a window is read into it)
_U64P = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
_U8P = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
_U32P = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")


@dataclass
class Chunks:
    """One contiguous run of chunks, in address order, the last one the top."""

    addr: np.ndarray  # uint64
    size: np.ndarray  # uint64
    inuse: np.ndarray  # bool: the next chunk's PREV_INUSE (the top: False)
    mmapped: bool = False  # a chunk of its own mapping: no next chunk's prev_size to use
    read_to: int = 0  # the walk's `sink` had every word from its start up to here


@dataclass
class _Window:
    addr: np.ndarray
    size: np.ndarray
    prev_inuse: np.ndarray  # each chunk's own PREV_INUSE bit: the previous one's state
    after: int  # where the chunk after the last one starts
    broken: bool  # that chunk is inside the window and not a header


@cache
def compiled() -> ctypes.CDLL | None:
    """The compiled walker, None where it was not built (or is of another version)."""
    try:
        lib = ctypes.CDLL(str(COMPILED))
    except OSError:
        return None
    if lib.refcntd_chunkwalk_version() != COMPILED_VERSION:
        return None
    lib.refcntd_chunkwalk.restype = ctypes.c_int64
    lib.refcntd_chunkwalk.argtypes = [_U64P, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                      _U64P, _U64P, _U8P, ctypes.c_uint64,
                                      ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_int32)]
    lib.refcntd_fastbins.restype = ctypes.c_int64
    lib.refcntd_fastbins.argtypes = [ctypes.c_int32, _U64P, ctypes.c_uint64, ctypes.c_uint64,
                                     _U64P, ctypes.c_uint64, _U8P, _U64P, _U32P,
                                     ctypes.c_uint64, ctypes.c_uint64, _U64P, _U64P]
    lib.refcntd_pointers.restype = ctypes.c_int64
    lib.refcntd_pointers.argtypes = [_U64P, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                     ctypes.c_uint64, _U64P, _U64P]
    return lib


def missing_note() -> str | None:
    """The one line a scan carries when it walked without the compiled walker."""
    if compiled() is not None:
        return None
    return (f"compiled chunk walker {COMPILED.name} missing or stale (bash scripts/setup.sh "
            "builds it): chunks followed with numpy, about 0.5 us each instead of a few ns, "
            "while the process is stopped")


def follow_fastbins(mem: ProcessMemory, heads: list[int], per_list: int
                    ) -> tuple[list[int], list[int]] | None:
    """The chunks of the fastbin lists from `heads` (each list at most `per_list` links),
    followed by chunkwalk.c reading the stopped process itself, and the chunks whose
    link it could not read (the caller reads on from there its own way); None without
    the compiled walker.  A link a step in Python cost ~1 us, 10^5 of them in perf's
    exit scan."""
    lib = compiled()
    if lib is None or mem.detached:  # it reads the process: a copy is read in Python
        return None
    if not any(heads):  # a small process's usual case: no buffers to map for it
        return [], []
    heads_a = np.array(heads, np.uint64)
    try:  # address space: refused under strict overcommit, where Python's walk goes on
        out = np.empty(len(heads) * per_list, np.uint64)  # pages touched only as written
        buf = np.empty(FASTBIN_WINDOWS * FASTBIN_WINDOW, np.uint8)
    except MemoryError:
        return None
    tags = np.ones(FASTBIN_WINDOWS, np.uint64)
    valid = np.zeros(2 * FASTBIN_WINDOWS, np.uint32)
    bad, stats = np.zeros(len(heads), np.uint64), np.zeros(2, np.uint64)
    got = lib.refcntd_fastbins(mem.pid, heads_a, len(heads), per_list, out, len(out), buf,
                               tags, valid, FASTBIN_WINDOWS, FASTBIN_WINDOW, bad, stats)
    mem.reads += int(stats[0])
    mem.bytes_read += int(stats[1])
    if got < 0:
        return None
    return out[:got].tolist(), [int(b) for b in bad.tolist() if b]


def walk(mem: ProcessMemory, start: int, end: int, numpy_only: bool = False,
         sink: Callable[[int, np.ndarray], None] | None = None) -> Chunks | None:
    """The chunks from `start` to the top chunk, which ends at `end` or, in the main
    heap (brk need not be page-aligned), within the last page before it; None when
    a size does not fit (not a glibc heap, or torn).  `numpy_only`: without the
    compiled walker even where it is built (the tests compare the two).  `sink`: given
    the words read (address, words) from `start` up to `read_to`, each word once,
    by the compiled walker (the numpy one gives none)."""
    lib = None if numpy_only else compiled()
    if lib is not None:
        return _compiled_walk(lib, mem, start, end, sink)
    parts: list[_Window] = []
    address = start
    while address < end:
        window = _window(mem, address, end)
        if window is None:
            break
        parts.append(window)
        address = window.after
        if window.broken:
            break
    if _torn(address, end, bool(parts)):
        return None
    if not parts:
        return Chunks(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, bool))
    prev = np.concatenate([w.prev_inuse for w in parts])
    return Chunks(np.concatenate([w.addr for w in parts]),
                  np.concatenate([w.size for w in parts]),
                  np.append(prev[1:], False))


def _torn(address: int, end: int, found: bool) -> bool:
    """The walk stopped short of the region's end, beyond the top's last page."""
    return address < end and (not found or end - address >= TAIL_SLACK)


def _compiled_walk(lib: ctypes.CDLL, mem: ProcessMemory, start: int, end: int,
                   sink: Callable[[int, np.ndarray], None] | None) -> Chunks | None:
    """walk, each window's chain followed by chunkwalk.c straight into arrays of one
    slot per possible chunk (the smallest is 32 bytes): only the pages written are
    memory (17 bytes a chunk), with no copy or concatenation after."""
    cap = (end - start) // 32 + 1
    addr, size, prev = np.empty(cap, np.uint64), np.empty(cap, np.uint64), \
        np.empty(cap + 1, np.uint8)
    after, broken = ctypes.c_uint64(), ctypes.c_int32()
    address, count = start, 0
    while address < end:
        words = mem.words_at(address, min(WINDOW, end - address) & ~15, reuse=True)
        got = lib.refcntd_chunkwalk(words, len(words) // 2, address, end, addr[count:],
                                    size[count:], prev[count:], cap - count,
                                    ctypes.byref(after), ctypes.byref(broken))
        if got < 0:
            break
        count += got
        if sink is not None:
            _give(sink, mem, address, words, after.value)
        address = after.value
        if broken.value:
            break
    if _torn(address, end, count > 0):
        return None
    prev[count] = 0  # the top: its next chunk, were there one, would say it is free
    return Chunks(addr[:count], size[:count], prev[1:count + 1].view(bool),
                  read_to=address if sink is not None else 0)


def _give(sink: Callable[[int, np.ndarray], None], mem: ProcessMemory, address: int,
          words: np.ndarray, after: int) -> None:
    """The words of [address, after) to the sink: the window's, and past its end (a
    chunk longer than the window) read on, since the next window starts at `after`."""
    sink(address, words[: (after - address) // 8])
    read = address + 8 * len(words)
    while read < after:
        more = mem.words_at(read, min(WINDOW, after - read), reuse=True)
        if not len(more):
            return
        sink(read, more)
        read += 8 * len(more)


def _window(mem: ProcessMemory, address: int, end: int) -> _Window | None:
    """The chain of chunks starting at `address` within one window; None when the
    first one is no header."""
    words = mem.words_at(address, min(WINDOW, end - address) & ~15, reuse=True)
    raw = words[1::2][: len(words) // 2]
    n = len(raw)
    # a header: size >= 32, a multiple of 16 (bit 3 clear), the chunk inside the region
    limit = np.uint64(end - address)
    valid = (raw >= 32) & ((raw & np.uint64(8)) == 0) & (raw < limit + np.uint64(8))
    valid &= _OFFSETS[:n] + (raw & _SIZE_MASK) <= limit
    if n == 0 or not valid[0]:
        return None
    cand = np.flatnonzero(valid)
    size = raw[cand] & _SIZE_MASK
    chain = _chain_from_first(cand, cand + (size >> np.uint64(4)).astype(np.int64))
    last = chain[-1]
    after = int(cand[last]) + (int(size[last]) >> 4)
    slots = cand[chain]
    return _Window(np.uint64(address) + slots.astype(np.uint64) * np.uint64(16), size[chain],
                   (raw[slots] & np.uint64(PREV_INUSE)).astype(bool),
                   address + 16 * after, after < n)


def _chain_from_first(cand: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Which candidates (by index) are reached from the first one (slot 0), each
    leading to the slot `target`."""
    keep = np.arange(len(cand))
    for _ in range(PRUNE_ROUNDS):
        if np.array_equal(target[keep[:-1]], cand[keep[1:]]):
            return keep
        at = _index_of(cand, target[keep])
        pointed = np.zeros(len(cand), bool)
        pointed[at[at >= 0]] = True
        pointed[0] = True
        if pointed[keep].all():
            return keep
        keep = keep[pointed[keep]]
    return _doubling(cand, target)


def _index_of(cand: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Each target's index among the candidates, -1 when it is none."""
    at = np.searchsorted(cand, target)
    at[at == len(cand)] = 0
    return np.where(cand[at] == target, at, -1)


def _doubling(cand: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Reached from the first candidate, for data that makes long false chains: the
    set reached in fewer than 2**k steps, grown with jumps of 2**k steps, k = 0, 1 ..."""
    at = _index_of(cand, target)
    jump = np.append(np.where(at >= 0, at, len(cand)), len(cand))  # the end: a sink
    reached = np.zeros(len(cand) + 1, bool)
    reached[0] = True
    while True:
        grown = reached.copy()
        grown[jump[reached]] = True
        if np.array_equal(grown, reached):
            return np.flatnonzero(reached[:-1])
        reached, jump = grown, jump[jump]
