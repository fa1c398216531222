"""GLib's slice allocator (GSlice, GLib 2.74) read from a stopped process's memory: each
slab chunk a block of its own, as valgrind sees it with G_SLICE=always-malloc.

GLib < 2.76 hands out GObjects (g_type_create_instance) and GStreamer's mini objects
from slabs unless G_SLICE=always-malloc is set: a slab is one malloc block (a page of
128 B to 8 KiB, `posix_memalign`ed to its own size) cut into chunks of one size, so a
heap walk alone sees many objects in one block.  The facts read here are those of
gslice.c in GLib 2.74.6 (Debian 12's, x86-64), which Debian ships without debug info:

- the static `Allocator` in libglib's data is found by its contents (min_page_size
  128, max_page_size 8192, the config, max_slab_chunk_size_for_magazine_cache);
- `allocator->slab_stack[ix]` (chunk size 16 * (ix + 1), 63 sizes up to 1008) is a
  ring of SlabInfo {chunks, n_allocated, next, prev}, 48 bytes before the end of its
  page; `chunks` is the slab's free list (linked by each chunk's first word);
- chunks on their way between a thread and the slabs are free too: the depot
  (`allocator->magazines[ix]`, a ring of chains whose first four chunks' second words
  link it) and each thread's two magazines per size (ThreadMemory, a 2032-byte malloc
  block whose first two words point into itself);
- a slab's chunks start at the page plus its cache colour, which GSlice does not
  keep: it is told from any free chunk of the slab; a slab without padding has colour
  0, and so has one of 16 bytes (the colour is a multiple of 16 below the padding);
  in a full one, from the instances in it (`_votes`): a word that is a GObject's
  class (its GType's TypeNode, libgobject 2.74: `data` at 0x20, whose InstanceData
  holds `class` at 56, `instance_size` at 64, `private_size` at 66, must name that
  class back and a chunk of this size: the chunk starts private_size bytes before the
  instance), or a GType whose node is its own (`supers[0]` at 0x48: a mini object,
  a GstStructure, whatever starts with its type) at a chunk's start.

A slab whose colour cannot be told (no vote, or votes that disagree) or whose books
do not add up stays one block: its objects get no kind, and a note says how many
slabs.  Other GLib versions are not read (a note); 2.76 and later allocate with
malloc, nothing to read.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from refcntd.reach.chunks import Chunks
from refcntd.reach.glibc import Heap
from refcntd.reach.graph import Words
from refcntd.reach.memory import Mapping, ProcessMemory

P2 = 16  # P2ALIGNMENT: chunk sizes are its multiples
SLAB_INFO = 48  # SLAB_INFO_SIZE: sizeof (SlabInfo) 32 + NATIVE_MALLOC_PADDING 16
MIN_PAGE, MAX_PAGE = 128, 8192  # allocator->min_page_size, max_page_size
SIZES = (MAX_PAGE - SLAB_INFO) // 8 // P2  # MAX_SLAB_INDEX: 63 chunk sizes, 16..1008
THREAD_MEMORY = 2048  # malloc chunk of ThreadMemory: 16 + 2 * SIZES Magazines of 16 bytes
# Allocator's fields (x86-64): the words at these offsets
A_MIN, A_MAX, A_ALWAYS_MALLOC, A_WORKING_SET, A_MAGAZINES, A_SLAB_STACK = 0, 8, 16, 32, 64, 104
ALLOCATOR_SIZE = 120
MAGAZINE_CHUNK_MAX = (MAX_PAGE - SLAB_INFO) // 8  # max_slab_chunk_size_for_magazine_cache
MAX_RING = 1 << 16  # slabs or magazines followed in one ring: a torn one ends
MAX_CHAIN = 1 << 12  # chunks followed in one list (a magazine holds at most 256)
VERSION = re.compile(r"libglib-2\.0\.so\.0\.(\d+)\.(\d+)$")
KNOWN_MINOR = 74


NODE_DATA, NODE_SELF = 0x20, 0x48  # TypeNode.data, TypeNode.supers[0]
DATA_CLASS, DATA_SIZES = 56, 64  # InstanceData.class; instance_size, private_size (u16)


@dataclass
class Slab:
    page: int
    page_size: int
    chunk: int  # chunk size
    allocated: int  # SlabInfo.n_allocated: chunks handed out (magazines' included)
    free: list[int]  # its free list
    color: int | None = None  # offset of its first chunk: None, unknown

    @property
    def count(self) -> int:
        return (self.page_size - SLAB_INFO) // self.chunk

    @property
    def padding(self) -> int:
        return self.page_size - SLAB_INFO - self.count * self.chunk


@dataclass
class Slabs:
    """What the read found; `split` applies it to the heap's blocks."""

    slabs: list[Slab] = field(default_factory=list)
    cached: dict[int, set[int]] = field(default_factory=dict)  # slab page: its chunks in
    #                                                            the magazines
    notes: list[str] = field(default_factory=list)
    split: int = 0  # slabs cut into chunks
    whole: int = 0  # slabs left one block (colour unknown, books not adding up)
    why: dict[str, int] = field(default_factory=dict)  # reason: slabs left whole for it
    live: int = 0  # chunks in use: blocks
    freed: int = 0  # chunks free (slab lists and magazines): no block


def page_size(chunk: int) -> int:
    """allocator_aligned_page_size (SLAB_BPAGE_SIZE): the power of two holding 8
    chunks and the SlabInfo, at least MIN_PAGE."""
    need = 8 * chunk + SLAB_INFO
    return max(1 << (need - 1).bit_length(), MIN_PAGE)


def glib_minor(maps: list[Mapping]) -> tuple[str, int | None] | None:
    """(libglib's path, its minor version or None when its name does not say), None
    without libglib."""
    for m in maps:
        name = m.path.rsplit("/", 1)[-1]
        if name.startswith("libglib-2.0.so"):
            found = VERSION.search(name)
            return m.path, int(found.group(1)) // 100 if found else None
    return None


def read_slabs(mem: ProcessMemory, maps: list[Mapping], runs: list[Chunks]) -> Slabs | None:
    """GSlice's slabs and free chunks, None where the process has none to read (no
    libglib, GLib 2.76+, G_SLICE=always-malloc, GSlice never used)."""
    glib = glib_minor(maps)
    if glib is None or (glib[1] is not None and glib[1] >= 76):
        return None
    out = Slabs()
    if glib[1] != KNOWN_MINOR:
        version = f"2.{glib[1]}" if glib[1] is not None else "of unknown version"
        out.notes.append(f"GLib {version} ({glib[0]}): its slice allocator's layout is known "
                         "for 2.74 only; GSlice slabs read as one malloc block each")
        return out
    allocator = _find_allocator(mem, maps, glib[0])
    if allocator is None:
        return None
    words = mem.words(allocator, ALLOCATOR_SIZE // 8)
    if words is None or words[A_ALWAYS_MALLOC // 8] & 0xFFFFFFFF:
        return None
    magazines, stack = words[A_MAGAZINES // 8], words[A_SLAB_STACK // 8]
    pages = _Reader(mem, maps)
    for ix, head in enumerate(mem.words(stack, SIZES) or []):
        out.slabs += _ring(pages, head, P2 * (ix + 1), out.notes)
    for ix, head in enumerate(mem.words(magazines, SIZES) or []):
        _by_page(out.cached, P2 * (ix + 1), _depot(pages, head))
    for tmem in _thread_memories(mem, runs):
        for ix, chunks in _thread_magazines(pages, tmem):
            _by_page(out.cached, P2 * (ix + 1), chunks)
    types = _Types(pages)
    for slab in out.slabs:
        slab.color = _color(slab, out.cached.get(slab.page, set()), pages, types)
    return out


def _by_page(cached: dict[int, set[int]], chunk: int, chunks: Iterable[int]) -> None:
    """Magazine chunks of one size, under the slab page each lies in (a slab is aligned
    to its size)."""
    mask = ~(page_size(chunk) - 1)
    for c in chunks:
        cached.setdefault(c & mask, set()).add(c)


def _color(slab: Slab, cached: set[int], pages: _Reader, types: _Types) -> int | None:
    """Where the slab's first chunk starts: from its free chunks, else 0 without
    padding, else from the instances in it; None when nothing tells it."""
    free = set(slab.free) | cached
    if free:
        colors = {(c - slab.page) % slab.chunk for c in free}
        return colors.pop() if len(colors) == 1 else None
    if slab.padding <= P2:  # colour_accu * 16 % padding
        return 0
    votes = _votes(slab, pages, types)
    return votes.pop() if len(votes) == 1 else None


def _votes(slab: Slab, pages: _Reader, types: _Types) -> set[int]:
    """The colours the instances in a full slab give (16-byte aligned words: a chunk
    and a private part are): a GObject's class decides (its checks are many), else
    every GType at a word's start must agree (a GType may also be some struct's
    field)."""
    words = pages.mem.words_at(slab.page, slab.page_size - SLAB_INFO)[::2]
    weak = set()
    for index in np.flatnonzero((words != 0) & (words % np.uint64(8) == 0)).tolist():
        offset, value = P2 * index, int(words[index])
        private = types.private_size(value, slab.chunk)
        if private is not None and offset >= private:
            if (offset - private) % slab.chunk < slab.padding:
                return {(offset - private) % slab.chunk}
        elif types.is_node(value):
            weak.add(offset % slab.chunk)
    return {c for c in weak if c < slab.padding} if len(weak) == 1 else weak


def _find_allocator(mem: ProcessMemory, maps: list[Mapping], path: str) -> int | None:
    """The static Allocator in libglib's writable data (its file's mappings and the
    anonymous one after them, its .bss), by its first words: min_page_size,
    max_page_size, the config (always_malloc, bypass_magazines, debug_blocks, 0 or 1;
    working_set_msecs) and the magazine cache's largest chunk (1018 or 0)."""
    after = False
    for m in maps:
        own = m.path == path
        if m.writable and (own or (after and not m.path)):
            data = np.frombuffer(mem.read(m.start, m.size)[: m.size & ~7], np.uint64)
            for i in np.flatnonzero(data[:-6] == np.uint64(MIN_PAGE)).tolist():
                w = data[i:i + 7].tolist()
                flags = (w[2] & 0xFFFFFFFF, w[2] >> 32, w[3] & 0xFFFFFFFF)
                if w[1] == MAX_PAGE and set(flags) <= {0, 1} and w[6] in (0, MAGAZINE_CHUNK_MAX):
                    return m.start + 8 * i
        after = own or (after and not m.path and m.writable)
    return None


class _Reader:
    """Words read a 4 KiB page at a time (a free list's links lie in one slab page),
    only inside the process's readable mappings: the words followed are its data."""

    def __init__(self, mem: ProcessMemory, maps: list[Mapping]) -> None:
        self.mem = mem
        self.pages: dict[int, list[int]] = {}  # lists: a word each, no numpy scalar
        readable = [(m.start, m.end) for m in maps if m.perms.startswith("r")]
        self.starts = [s for s, _ in readable]
        self.ends = [e for _, e in readable]

    def word(self, address: int) -> int | None:
        if address % 8:
            return None
        base = address & ~0xFFF
        page = self.pages.get(base)
        if page is None:
            at = bisect_right(self.starts, address) - 1
            if at < 0 or address + 8 > self.ends[at]:
                return None
            page = self.pages[base] = self.mem.words_at(base, 4096).tolist()
        at = (address - base) // 8
        return page[at] if at < len(page) else None


class _Types:
    """GTypes and classes seen in slabs, each value checked once."""

    def __init__(self, pages: _Reader) -> None:
        self.pages = pages
        self.nodes: dict[int, bool] = {}
        self.classes: dict[int, tuple[int, int] | None] = {}

    def is_node(self, value: int) -> bool:
        """A derived GType: the address of a TypeNode whose supers[0] is itself."""
        if value not in self.nodes:
            self.nodes[value] = self.pages.word(value + NODE_SELF) == value
        return self.nodes[value]

    def private_size(self, value: int, chunk: int) -> int | None:
        """For a GObject class whose instances take chunks of `chunk` bytes: their
        private size (the instance's offset in its chunk)."""
        if value not in self.classes:
            self.classes[value] = self._sizes(value)
        sizes = self.classes[value]
        if sizes is None or -(-(sizes[0] + sizes[1]) // P2) * P2 != chunk:
            return None
        return sizes[1]

    def _sizes(self, klass: int) -> tuple[int, int] | None:
        gtype = self.pages.word(klass)
        if not gtype or not self.is_node(gtype):
            return None
        data = self.pages.word(gtype + NODE_DATA)
        if not data or self.pages.word(data + DATA_CLASS) != klass:
            return None
        sizes = self.pages.word(data + DATA_SIZES)
        return None if sizes is None else (sizes & 0xFFFF, (sizes >> 16) & 0xFFFF)


def _ring(pages: _Reader, head: int, chunk: int, notes: list[str]) -> list[Slab]:
    """The slabs of one chunk size: the ring of SlabInfos from `head`."""
    out: list[Slab] = []
    size = page_size(chunk)
    info, seen = head, set[int]()
    while info and info not in seen and len(seen) < MAX_RING:
        seen.add(info)
        page = info + SLAB_INFO - size
        fields = [pages.word(info + 8 * k) for k in range(3)]
        if page % size or None in fields:
            notes.append(f"GSlice slab info at {info:#x} (chunks of {chunk} bytes) does not "
                         "check out: the rest of its ring not read")
            break
        first, allocated, nxt = (int(f) for f in fields)  # type: ignore[arg-type]
        out.append(Slab(page, size, chunk, allocated & 0xFFFFFFFF,
                        _chain(pages, first, page, info)))
        info = nxt
    return out


def _chain(pages: _Reader, first: int, lo: int = 0, hi: int = 1 << 64) -> list[int]:
    """The chunks linked by their first word from `first`, while inside [lo, hi)."""
    out: list[int] = []
    link: int | None = first
    while link and lo <= link < hi and len(out) < MAX_CHAIN:
        out.append(link)
        link = pages.word(link)
    return out


def _depot(pages: _Reader, head: int) -> set[int]:
    """The chunks of the depot's magazines of one size: a ring whose next magazine is
    `mc->next->next->data` (magazine_chain_next), each a chain linked by `next`."""
    out: set[int] = set()
    magazine, seen = head, set[int]()
    while magazine and magazine not in seen and len(seen) < MAX_RING:
        seen.add(magazine)
        chain = _chain(pages, magazine)
        out.update(chain)
        if len(chain) < 4:
            break
        magazine = pages.word(chain[2] + 8) or 0
    return out


def _thread_memories(mem: ProcessMemory, runs: list[Chunks]) -> list[int]:
    """Each thread's ThreadMemory: an in-use malloc block of THREAD_MEMORY bytes whose
    first word points 16 bytes into it (magazine1) and second SIZES magazines on."""
    out = []
    for run in runs:
        for chunk in run.addr[run.inuse & (run.size == np.uint64(THREAD_MEMORY))].tolist():
            head = mem.words(chunk + 16, 2)
            if head is not None and head[0] == chunk + 32 and head[1] == chunk + 32 + 16 * SIZES:
                out.append(chunk + 16)
    return out


def _thread_magazines(pages: _Reader, tmem: int) -> list[tuple[int, list[int]]]:
    """(size index, chunks) of a thread's two magazines per size: {chunks, count}."""
    data = pages.mem.words(tmem + 16, 4 * SIZES) or []
    return [(i % SIZES, _chain(pages, data[2 * i]))
            for i in range(2 * SIZES) if i < len(data) // 2 and data[2 * i]]


def split(heap: Heap, slabs: Slabs | None, words: Words | None = None) -> None:
    """The heap's blocks with each slab's block replaced by its chunks in use (a block
    each, its words its own up to its end: no next chunk's prev_size to borrow), its
    free chunks among the heap's freed ones; `words` (the pointers read) tell the
    colour of a full slab no instance told.  Slabs it cannot cut stay one block."""
    if slabs is None or not slabs.slabs or not len(heap.starts):
        return
    if words is not None:
        _told_by_pointers([s for s in slabs.slabs if s.color is None], words)
    drop, live, free = [], [], []
    pages = np.array([s.page for s in slabs.slabs], np.uint64)
    for slab, index in zip(slabs.slabs, np.searchsorted(heap.starts, pages).tolist(),
                           strict=True):
        cut = _cut(heap, index, slab, slabs.cached.get(slab.page, set()))
        if isinstance(cut, str):
            slabs.whole += 1
            slabs.why[cut] = slabs.why.get(cut, 0) + 1
            continue
        used, unused = cut
        drop.append(index)
        live.append(used)
        free.append(unused)
    slabs.split = len(drop)
    if slabs.whole:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(slabs.why.items()))
        slabs.notes.append(f"{slabs.whole} of {len(slabs.slabs)} GSlice slab(s) left one "
                           f"block ({why}): objects sharing one get no kind")
    if not drop:
        return
    keep = np.ones(len(heap.starts), bool)
    keep[drop] = False
    starts = np.concatenate([heap.starts[keep], *(u[0] for u in live)])
    ends = np.concatenate([heap.ends[keep], *(u[1] for u in live)])
    tails = np.concatenate([heap.tails[keep], *(u[1] for u in live)])
    order = np.argsort(starts, kind="stable")
    heap.starts, heap.ends, heap.tails = starts[order], ends[order], tails[order]
    slabs.live = sum(len(u[0]) for u in live)
    slabs.freed = sum(len(f[0]) for f in free)
    freed = np.concatenate([heap.freed, *(f[0] for f in free)])
    freed_ends = np.concatenate([heap.freed_ends, *(f[1] for f in free)])
    order = np.argsort(freed, kind="stable")
    heap.freed, heap.freed_ends = freed[order], freed_ends[order]


def _cut(heap: Heap, index: int, slab: Slab, cached: set[int]
         ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | str:
    """((starts, ends) of the slab's chunks in use, of its free ones), or why it cannot
    be cut: colour unknown, no block of its own at the page (`index`: where it would
    be), free chunks off its grid, or a count handed out other than n_allocated."""
    if slab.color is None:
        return f"where the chunks of {slab.chunk} bytes start not told"
    if index >= len(heap.starts) or int(heap.starts[index]) != slab.page or \
            int(heap.ends[index]) < slab.page + slab.page_size - SLAB_INFO:
        return "no malloc block of its own"
    first = slab.page + slab.color
    free = np.zeros(slab.count, bool)
    for chunk in set(slab.free) | cached:
        at, off = divmod(chunk - first, slab.chunk)
        if off or not 0 <= at < slab.count:
            return "a free chunk off its grid"
        free[at] = True
    if slab.count - len(set(slab.free)) != slab.allocated:
        return "books that do not add up"
    chunks = np.uint64(first) + np.arange(slab.count, dtype=np.uint64) * np.uint64(slab.chunk)
    size = np.uint64(slab.chunk)
    return (chunks[~free], chunks[~free] + size), (chunks[free], chunks[free] + size)


def _told_by_pointers(slabs: list[Slab], words: Words) -> None:
    """The colour of a full slab holding no instance (GLists, arrays ...) from the
    pointers into it: each colour scores the pointers at one of its chunks' starts,
    less twice those before its first chunk or after its last (no chunk is there: for
    the true colour such a value is a stray word, seen in 1 of ~20 runs of
    gslicekinds.c, so it counts against a colour without ruling it out); the colour
    with the best score above 0 is taken when no other has as much."""
    if not slabs or not words.values:
        return
    values = np.concatenate(words.values).astype(np.uint64, copy=False)
    for slab in slabs:
        inside = values[(values >= np.uint64(slab.page)) &
                        (values < np.uint64(slab.page + slab.page_size - SLAB_INFO))]
        offsets = (inside - np.uint64(slab.page)).astype(np.int64)
        score = {}
        for color in range(0, slab.padding, P2):
            within = (offsets >= color) & (offsets < color + slab.count * slab.chunk)
            starts = within & ((offsets - color) % slab.chunk == 0)
            score[color] = int(np.count_nonzero(starts)) - 2 * int(np.count_nonzero(~within))
        best = sorted(score.items(), key=lambda kv: -kv[1])
        if best and best[0][1] > 0 and (len(best) == 1 or best[1][1] < best[0][1]):
            slab.color = best[0][0]
