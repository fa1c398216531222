"""glibc malloc's in-use blocks, walked from its own chunk headers (glibc 2.26-2.38).

A chunk is `prev_size, size|flags` followed by the user's bytes; it is in use when
the next chunk's PREV_INUSE bit is set, except that chunks in a fastbin or in a
thread's tcache keep that bit: those lists are followed (their links are mangled,
safe-linking since 2.32) and their chunks left out, so stale pointers in freed memory
never make a lost object look reachable.  Where the chunks are:

- the main arena: the `[heap]` mapping, chunk after chunk up to the top chunk;
- thread arenas: 64 MiB-aligned heaps, each starting with `heap_info` (the first one
  of an arena also holds its `malloc_state`);
- blocks of 128 KiB and more: their own mapping, size flagged IS_MMAPPED.

The arenas themselves (for their fastbins) are found without debug symbols: the
main arena is the word in libc's data whose value is the top chunk of `[heap]` and
whose `next` field points to an arena; a thread arena is `heap_info.ar_ptr`.
Anything that does not check out is said in `notes`, and the walk gives up rather
than guesses (`recognised` false): the caller then keeps today's verdicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from refcntd.reach.chunks import HEAP_MAX, Chunks, follow_fastbins, missing_note, walk
from refcntd.reach.graph import PointerFilter, Words
from refcntd.reach.memory import Mapping, ProcessMemory

IS_MMAPPED = 2
HEAP_INFO = 48  # sizeof(heap_info) in 2.35+: ar_ptr, prev, size, mprotect_size, pagesize, pad
ARENA_SIZE = 2200  # sizeof(struct malloc_state), 64-bit
ARENA_FASTBINS, ARENA_TOP, ARENA_NEXT = 16, 96, 2160  # field offsets in malloc_state
NFASTBINS = 10
FASTBIN_LIST_MAX = 1 << 20  # links followed in one list: a corrupt cycle ends
TCACHE_CHUNK = 0x290  # tcache_perthread_struct: 64 u16 counts, 64 entries
TCACHE_BINS, TCACHE_MAX_COUNT = 64, 65535
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "tbbmalloc", "snmalloc")


@dataclass
class Heap:
    """In-use blocks (user pointer, end of the chunk), sorted, and the memory they live
    in (never a root).  `tails`: where the block's bytes end as a holder of pointers,
    8 bytes past `ends`: the next chunk's prev_size is the last word of an in-use
    chunk's usable bytes (malloc_usable_size), where a struct's last field lives; as a
    pointer's target that word is the next chunk's header (glibc's bins point there)."""

    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    tails: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    regions: list[tuple[int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recognised: bool = True
    free_chunks: int = 0  # in fastbins and tcaches: left out
    freed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # their starts
    freed_ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    runs: list[Chunks] = field(default_factory=list)  # read, not yet settled
    free: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # chunk addresses
    span: tuple[int, int] = (0, 0)  # from the lowest region's start to the highest's end
    covered: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # per
    #         region: the part whose words the walk kept (read_heap's `words`)


def find_heap(mem: ProcessMemory, maps: list[Mapping]) -> Heap:
    heap = read_heap(mem, maps)
    settle(heap)
    return heap


def read_heap(mem: ProcessMemory, maps: list[Mapping], words: Words | None = None) -> Heap:
    """What needs the process stopped: the chunks and the free lists (`settle` makes the
    sorted in-use blocks from them afterwards, the process no longer needed).  `words`:
    the words that may point into a block are kept there as the chunks are walked (the
    heap read once, not once more for the pointers); `covered` says where."""
    heap = Heap()
    names = {m.path.rsplit("/", 1)[-1] for m in maps if m.path}  # each file once
    other = sorted({a for name in names for a in OTHER_ALLOCATORS if a in name})
    if other:
        heap.recognised = False
        heap.notes.append(f"allocator {', '.join(other)} is not glibc malloc: reachability "
                          "not scanned, verdicts as without it")
        return heap
    if not any(name.startswith("libc.so") for name in names):
        heap.recognised = False
        heap.notes.append("no glibc in the process (static or another C library): "
                          "reachability not scanned")
        return heap
    if (note := missing_note()) is not None:
        heap.notes.append(note)
    heaps = list(_heap_mappings(mem, maps))
    mapped = list(_mmapped_chunks(mem, maps, [(m.start, m.end) for m, *_ in heaps]))
    bounds = [(m.start, m.end) for m, *_ in heaps] + [(a, a + n) for a, n in mapped]
    heap.span = (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else (0, 0)
    arenas, top = [], 0
    for run, region, arena in _arena_runs(mem, heaps, heap, words):
        heap.regions.append(region)
        arenas.append(arena)
        top = int(run.addr[-1]) if arena == 0 and len(run.addr) else top
        heap.runs.append(run)
    for address, size in mapped:
        heap.regions.append((address, address + size))
        heap.runs.append(Chunks(np.array([address], np.uint64), np.array([size], np.uint64),
                                np.array([True]), mmapped=True))
    main = _main_arena(mem, maps, heap, top, arenas) if heap.recognised and top else None
    if heap.recognised:
        free: set[int] = set()
        pages = _Pages(mem)  # both kinds of free list: links near each other, read once
        for arena in [a for a in arenas if a] + ([main] if main else []):
            free |= _fastbin_chunks(mem, pages, arena, heap)
        free |= _tcache_chunks(mem, pages, heap.runs)
        heap.free = np.array(sorted(free), np.uint64)
    return heap


def settle(heap: Heap) -> None:
    """The sorted in-use blocks of the chunks read, those in a free list left out."""
    heap.starts, heap.ends, heap.tails = _in_use(heap.runs)
    heap.runs = []
    if heap.recognised:
        keep = ~_members(heap.starts - np.uint64(16), heap.free)
        heap.free_chunks = len(keep) - int(np.count_nonzero(keep))
        heap.freed, heap.freed_ends = heap.starts[~keep], heap.ends[~keep]
        heap.starts, heap.ends, heap.tails = (a[keep] for a in (heap.starts, heap.ends,
                                                               heap.tails))


def blocks_read(heap: Heap) -> int:
    """The in-use blocks of the chunks read (before `settle`), those in a free list out."""
    return sum(int(np.count_nonzero(r.inuse)) for r in heap.runs) - len(heap.free)


def _members(items: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """np.isin for a sorted set: a binary search each, without isin's sort of both
    (a third of perf report's exit scan, with 10^5 chunks in its fastbins)."""
    if not len(sorted_set):
        return np.zeros(len(items), bool)
    at = np.minimum(np.searchsorted(sorted_set, items), len(sorted_set) - 1)
    found: np.ndarray = sorted_set[at] == items
    return found


def _in_use(runs: list[Chunks]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted user starts, ends and tails (Heap) of the in-use chunks."""
    if not runs:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    addr = np.concatenate([r.addr[r.inuse] for r in runs])
    size = np.concatenate([r.size[r.inuse] for r in runs])
    if len(addr) > 1 and not bool((addr[1:] > addr[:-1]).all()):
        order = np.argsort(addr, kind="stable")
        addr, size = addr[order], size[order]
    ends = addr + size
    tails = ends + np.uint64(8)
    mapped = np.array([int(r.addr[0]) for r in runs if r.mmapped and len(r.addr)], np.uint64)
    if len(mapped):  # a chunk of its own mapping (few): no next chunk to borrow from
        tails[np.searchsorted(addr, mapped)] -= np.uint64(8)
    return addr + np.uint64(16), ends, tails


def _heap_mappings(mem: ProcessMemory, maps: list[Mapping]
                   ) -> Iterator[tuple[Mapping, int, int, int]]:
    """(mapping, first chunk, end of its chunks, arena address or 0 for the main one)
    of [heap] and of each 64 MiB-aligned mapping that starts with a heap_info.  [heap]
    may be several mappings end to end (glibc.malloc.hugetlb=1 madvises parts of it
    for huge pages, which splits it): one heap."""
    brk = _joined_heap(maps)
    if brk is not None:
        yield brk, brk.start, brk.end, 0
    for m in maps:
        if not m.path and m.writable and m.start % HEAP_MAX == 0:
            info = mem.words(m.start, 4)
            if info is None:
                continue
            ar_ptr, _prev, size, _mprotect = info
            if not (HEAP_INFO <= size <= m.size) or ar_ptr == 0:
                continue
            first = m.start + HEAP_INFO
            if ar_ptr == first:  # the arena's first heap: its malloc_state comes first
                first = (ar_ptr + ARENA_SIZE + 15) & ~15
            yield m, first, m.start + size, ar_ptr


def _joined_heap(maps: list[Mapping]) -> Mapping | None:
    """The [heap] mappings as one, from the first to the end of those that follow it."""
    heap = next((m for m in maps if m.path == "[heap]"), None)
    for m in maps:
        if heap is not None and m.path == "[heap]" and m.start == heap.end:
            heap = heap._replace(end=m.end)
    return heap


def _arena_runs(mem: ProcessMemory, heaps: list[tuple[Mapping, int, int, int]], heap: Heap,
                words: Words | None) -> Iterator[tuple[Chunks, tuple[int, int], int]]:
    """(chunks, region, arena address or 0 for the main one) of every heap whose chunks
    add up (a thread heap whose do not: a note, and the objects in it get no kind,
    never a guessed one; its words, kept by the walk, are dropped with it)."""
    keep = None if words is None else PointerFilter(*heap.span)
    for m, first, end, arena in heaps:
        part = Words()
        run = walk(mem, first, end, sink=None if keep is None else keep.into(part))
        if arena == 0 and run is None:
            heap.recognised = False
            heap.notes.append(f"[heap] at {m.start:#x} is not a glibc malloc heap "
                              "(chunk sizes do not add up): reachability not scanned")
            return
        if run is None or (arena and not len(run.addr)):
            heap.notes.append(f"thread heap at {m.start:#x}: chunk sizes do not add up, its "
                              "blocks not scanned (objects in it get no kind)")
            continue
        if words is not None and run.read_to > first:
            words.extend(part)
            heap.covered[(m.start, m.end)] = (first, run.read_to)
        yield run, (m.start, m.end), arena


def _main_arena(mem: ProcessMemory, maps: list[Mapping], heap: Heap, top: int,
                arenas: list[int]) -> int | None:
    """main_arena in libc's data: its `top` is [heap]'s top chunk, its `next` an arena."""
    known = {a for a in arenas if a}
    for m in _libc_data(maps):
        data = np.frombuffer(mem.read(m.start, m.size)[: m.size & ~7], np.uint64)
        for index in np.flatnonzero(data == np.uint64(top)):
            arena = m.start + 8 * int(index) - ARENA_TOP
            nxt = mem.word(arena + ARENA_NEXT)
            if nxt == arena or nxt in known:
                return arena
    heap.notes.append("glibc's main arena not found in libc's data: chunks in its fastbins "
                      "counted as in use")
    return None


def _libc_data(maps: list[Mapping]) -> Iterator[Mapping]:
    """libc's writable mappings and the anonymous one after them (its .bss)."""
    after_libc = False
    for m in maps:
        is_libc = m.path.rsplit("/", 1)[-1].startswith("libc.so")
        if m.writable and (is_libc or (after_libc and not m.path)):
            yield m
        after_libc = is_libc or (after_libc and not m.path and m.writable)


def _fastbin_chunks(mem: ProcessMemory, pages: _Pages, arena: int, heap: Heap) -> set[int]:
    """Chunks in the arena's fastbins (fd mangled: stored ^ (its own address >> 12)):
    followed by the compiled walker where built, in Python from where it could not read
    (or all of them without it)."""
    heads = mem.words(arena + ARENA_FASTBINS, NFASTBINS) or []
    out: set[int] = set()
    followed = follow_fastbins(mem, heads, FASTBIN_LIST_MAX)
    if followed is not None:
        chunks, heads = followed
        out.update(chunks)
        out.difference_update(heads)  # read again below, their own way
    for chunk in heads:
        for _ in range(FASTBIN_LIST_MAX):
            if not chunk or chunk in out:
                break
            out.add(chunk)
            stored = pages.word(chunk + 16)
            if stored is None:
                heap.notes.append(f"fastbin chunk {chunk:#x} unreadable")
                break
            chunk = stored ^ ((chunk + 16) >> 12)
    return out


class _Pages:
    """Words read a window at a time: a fastbin list is tens of thousands of links
    (perf report's exit: 1.1 s of one read per link), mostly near each other."""

    WINDOW = 64 << 10

    def __init__(self, mem: ProcessMemory) -> None:
        self.mem = mem
        self.windows: dict[int, tuple[int, bytes]] = {}  # base: (offset read from, bytes)

    def word(self, address: int) -> int | None:
        base = address - address % self.WINDOW
        got = self.windows.get(base)
        if got is None:
            got = self.windows[base] = self._window(base, address)
        begins, data = got
        at = address - base - begins
        if at < 0 or at + 8 > len(data):
            return self.mem.word(address)  # outside what the window could read
        return int.from_bytes(data[at:at + 8], "little")

    def _window(self, base: int, address: int) -> tuple[int, bytes]:
        """The window's bytes; when it begins before the mapping (a heap seldom starts on
        a 64 KiB boundary: every link of a small process's tcache was read alone, one
        syscall each), from the address's page on."""
        data = self.mem.read(base, self.WINDOW)
        if data:
            return 0, data
        page = address & ~0xFFF
        return page - base, self.mem.read(page, base + self.WINDOW - page)


def _tcache_chunks(mem: ProcessMemory, pages: _Pages, runs: list[Chunks]) -> set[int]:
    """Chunks in threads' tcaches: each tcache_perthread_struct is an in-use chunk of
    0x290 bytes whose every list checks out (sizes, counts, a null end)."""
    out: set[int] = set()
    for run in runs:
        for chunk in run.addr[run.inuse & (run.size == np.uint64(TCACHE_CHUNK))].tolist():
            found = _tcache_lists(mem, pages, chunk + 16, runs)
            if found is not None:
                out |= found
    return out


def _chunk_size(runs: list[Chunks], user: int) -> int:
    """The size of the in-use chunk whose user pointer is `user`, 0 if none."""
    if user < 16:
        return 0
    chunk = np.uint64(user - 16)
    for run in runs:
        i = int(np.searchsorted(run.addr, chunk))
        if i < len(run.addr) and run.addr[i] == chunk:
            return int(run.size[i]) if run.inuse[i] else 0
    return 0


def _tcache_lists(mem: ProcessMemory, pages: _Pages, user: int, runs: list[Chunks]
                  ) -> set[int] | None:
    raw = mem.read(user, TCACHE_CHUNK - 16)
    if len(raw) != TCACHE_CHUNK - 16:
        return None
    counts = np.frombuffer(raw[:2 * TCACHE_BINS], np.uint16).tolist()
    entries = np.frombuffer(raw[2 * TCACHE_BINS:], np.uint64).tolist()
    out: set[int] = set()
    for index, (entry, count) in enumerate(zip(entries, counts, strict=True)):
        if (entry == 0) != (count == 0):
            return None
        for _ in range(count):
            if _chunk_size(runs, entry) != 32 + 16 * index:
                return None
            out.add(entry - 16)
            stored = pages.word(entry)
            if stored is None:
                return None
            entry = stored ^ (entry >> 12)
        if entry != 0:
            return None
    return out


def _mmapped_chunks(mem: ProcessMemory, maps: list[Mapping], taken: list[tuple[int, int]]
                    ) -> Iterator[tuple[int, int]]:
    """Blocks malloc gave their own mapping: at a page start, prev_size 0, size a page
    multiple flagged IS_MMAPPED only; adjacent ones share one mapping."""
    for m in maps:
        if m.path or not m.writable or any(s <= m.start < e for s, e in taken):
            continue
        address = m.start
        while address + 4096 <= m.end:
            head = mem.words(address, 2)
            if head is None or head[0] != 0 or head[1] & 7 != IS_MMAPPED:
                break
            size = head[1] & ~7
            if size == 0 or size % 4096 or address + size > m.end:
                break
            yield address, size
            address += size
