"""GSlice's slabs (GLib 2.74) read from a synthetic memory image laid out as gslice.c
lays it: the Allocator in libglib's data, slab rings, the depot, a thread's magazines,
GObject classes; then the heap's blocks cut into chunks."""

from __future__ import annotations

import struct

import numpy as np

from refcntd.reach import gslice
from refcntd.reach.chunks import Chunks
from refcntd.reach.glibc import Heap
from refcntd.reach.graph import Words
from refcntd.reach.memory import Mapping, ProcessMemory

GLIB = "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.6"
DATA, HEAP = 0x7F00_0001_0000, 0x5500_0000_0000
ALLOCATOR = DATA + 0x100
STACK, DEPOT = HEAP + 0x100, HEAP + 0x400  # slab_stack[63], magazines[63]
CHUNK, PAGE = 48, 512  # size index 2: 9 chunks a page, 32 bytes of padding
TMEM = HEAP + 0x10000  # ThreadMemory's malloc chunk (2048 bytes)
KLASS, NODE, TDATA = HEAP + 0x800, HEAP + 0x900, HEAP + 0xA00


class Image:
    def __init__(self) -> None:
        self.data = bytearray(0x1000)
        self.heap = bytearray(0x20000)

    def put(self, address: int, *words: int) -> None:
        mem, base = (self.data, DATA) if address < HEAP or address >= DATA else \
            (self.heap, HEAP)
        struct.pack_into(f"<{len(words)}Q", mem, address - base, *words)

    def memory(self) -> ProcessMemory:
        mem = ProcessMemory(0)
        mem.detached = True
        mem.keep(DATA, np.frombuffer(bytes(self.data), np.uint8))
        mem.keep(HEAP, np.frombuffer(bytes(self.heap), np.uint8))
        return mem


def maps() -> list[Mapping]:
    return [Mapping(HEAP, HEAP + 0x20000, "rw-p", 0, 0, "[heap]"),
            Mapping(DATA, DATA + 0x1000, "rw-p", 0, 1, GLIB)]


def page(n: int) -> int:
    return HEAP + 0x2000 + n * PAGE


def slab(img: Image, n: int, free: list[int], allocated: int, nxt: int) -> int:
    """Slab n's SlabInfo: its free list (chunk addresses, linked by their first word)."""
    info = page(n) + PAGE - gslice.SLAB_INFO
    img.put(info, free[0] if free else 0, allocated, nxt, 0)
    link(img, free)
    return info


def link(img: Image, chunks: list[int]) -> None:
    """Each chunk's first word: the next one (0 after the last)."""
    for i, chunk in enumerate(chunks):
        img.put(chunk, chunks[i + 1] if i + 1 < len(chunks) else 0)


def image() -> Image:
    """Six slabs of 48-byte chunks in one ring: 0 has two chunks on its free list
    (colour 16); 1 is full and holds a GObject instance 16 bytes into chunk 2 (private
    data of 16, colour 16); 2 is full with one chunk in the thread's magazine2 (colour
    0); 3 is full with one chunk in the depot (colour 16); 4 and 5 are full with
    nothing in them to tell."""
    img = Image()
    img.put(ALLOCATOR, 128, 8192, 0, 0, 15000, 1, gslice.MAGAZINE_CHUNK_MAX)
    img.put(ALLOCATOR + gslice.A_MAGAZINES, DEPOT)
    img.put(ALLOCATOR + gslice.A_SLAB_STACK, STACK)
    infos = [page(n) + PAGE - gslice.SLAB_INFO for n in range(6)]
    img.put(STACK + 8 * 2, infos[0])
    slab(img, 0, [page(0) + 16 + 48 * 3, page(0) + 16 + 48 * 7], 7, infos[1])
    slab(img, 1, [], 9, infos[2])
    img.put(page(1) + 16 + 48 * 2 + 16, KLASS)  # the instance's g_class
    img.put(KLASS, NODE)  # GTypeClass.g_type
    img.put(NODE + gslice.NODE_SELF, NODE)
    img.put(NODE + gslice.NODE_DATA, TDATA)
    img.put(TDATA + gslice.DATA_CLASS, KLASS)
    img.put(TDATA + gslice.DATA_SIZES, 32 | 16 << 16)  # instance_size 32, private 16
    slab(img, 2, [], 9, infos[3])
    img.put(TMEM + 16, TMEM + 32, TMEM + 32 + 16 * gslice.SIZES)
    magazine2 = TMEM + 32 + 16 * gslice.SIZES + 16 * 2
    img.put(magazine2, page(2) + 48 * 5, 1)
    slab(img, 3, [], 9, infos[4])
    chain = [page(3) + 16 + 48 * k for k in range(4)]  # a depot magazine of 4
    link(img, chain)
    img.put(chain[2] + 8, chain[0])  # magazine_chain_next: the ring of one
    img.put(DEPOT + 8 * 2, chain[0])
    slab(img, 4, [], 9, infos[5])
    slab(img, 5, [], 9, infos[0])
    return img


def runs() -> list[Chunks]:
    return [Chunks(np.array([TMEM], np.uint64), np.array([gslice.THREAD_MEMORY], np.uint64),
                   np.array([True]))]


def test_slabs_and_free_chunks_are_read() -> None:
    slabs = gslice.read_slabs(image().memory(), maps(), runs())
    assert slabs is not None and slabs.notes == []
    assert [s.page for s in slabs.slabs] == [page(n) for n in range(6)]
    assert {s.chunk for s in slabs.slabs} == {CHUNK} and slabs.slabs[0].allocated == 7
    assert slabs.slabs[0].free == [page(0) + 16 + 48 * 3, page(0) + 16 + 48 * 7]
    assert slabs.cached == {page(2): {page(2) + 48 * 5},
                            page(3): {page(3) + 16 + 48 * k for k in range(4)}}
    # the free list, the instance's class, the magazine, the depot; nothing in 4 and 5
    assert [s.color for s in slabs.slabs] == [16, 16, 0, 16, None, None]


def test_other_versions_and_always_malloc_are_not_read() -> None:
    img = image()
    other = [m._replace(path=m.path.replace("7400.6", "7200.4")) for m in maps()]
    slabs = gslice.read_slabs(img.memory(), other, runs())
    assert slabs is not None and slabs.slabs == []
    assert "GLib 2.72" in slabs.notes[0] and "2.74 only" in slabs.notes[0]
    newer = [m._replace(path=m.path.replace("7400.6", "7800.0")) for m in maps()]
    assert gslice.read_slabs(img.memory(), newer, runs()) is None  # malloc since 2.76
    img.put(ALLOCATOR + gslice.A_ALWAYS_MALLOC, 1)
    assert gslice.read_slabs(img.memory(), maps(), runs()) is None


def heap_with_pages() -> Heap:
    starts = np.array([HEAP + 0x40] + [page(n) for n in range(6)], np.uint64)
    ends = starts + np.array([0x20] + [PAGE - 16] * 6, np.uint64)
    return Heap(starts=starts, ends=ends, tails=ends + np.uint64(8))


def test_split_gives_each_chunk_in_use_a_block() -> None:
    slabs = gslice.read_slabs(image().memory(), maps(), runs())
    heap = heap_with_pages()
    words = Words()  # a pointer to slab 4's chunk 1 at colour 16; nothing into slab 5
    words.add(np.array([page(4) + 16 + 48]), np.array([HEAP + 0x50], np.uint64), None)
    gslice.split(heap, slabs, words)
    assert slabs is not None and slabs.split == 5 and slabs.whole == 1
    assert slabs.slabs[4].color == 16
    starts = heap.starts.tolist()
    assert starts[0] == HEAP + 0x40 and page(5) in starts  # slab 5: one block still
    cut = [s for s in starts if page(0) <= s < page(5)]
    expected = {page(0) + 16 + 48 * k for k in range(9)} - set(slabs.slabs[0].free)
    expected |= {page(1) + 16 + 48 * k for k in range(9)}
    expected |= {page(2) + 48 * k for k in range(9)} - {page(2) + 48 * 5}
    expected |= {page(3) + 16 + 48 * k for k in range(4, 9)}
    expected |= {page(4) + 16 + 48 * k for k in range(9)}
    assert cut == sorted(expected)
    assert (heap.ends[np.isin(heap.starts, cut)] - heap.starts[np.isin(heap.starts, cut)]
            == CHUNK).all()
    assert slabs.freed == 2 + 1 + 4 and heap.freed.tolist() == sorted(heap.freed.tolist())
    assert page(0) + 16 + 48 * 3 in heap.freed.tolist()
    assert slabs.notes == ["1 of 6 GSlice slab(s) left one block (1 where the chunks of 48 "
                           "bytes start not told): objects sharing one get no kind"]


def test_books_that_do_not_add_up_leave_the_slab_whole() -> None:
    img = image()
    img.put(page(0) + PAGE - gslice.SLAB_INFO + 8, 8)  # n_allocated 8, 2 free of 9
    slabs = gslice.read_slabs(img.memory(), maps(), runs())
    heap = heap_with_pages()
    gslice.split(heap, slabs, None)
    assert slabs is not None and slabs.whole == 3 and page(0) in heap.starts.tolist()
    assert slabs.why == {"books that do not add up": 1,
                         "where the chunks of 48 bytes start not told": 2}


def test_a_stray_word_before_the_first_chunk_does_not_rule_the_colour_out() -> None:
    """The shape caught in gslicekinds.c (1 run in ~20): a full slab of 48-byte chunks
    with every chunk start pointed to at colour 16, and one word whose value is the
    page plus 4, where no chunk is at either colour.  Before, that one word ruled colour
    16 out and the slab stayed whole; a lone stray still tells nothing."""
    slabs = gslice.read_slabs(image().memory(), maps(), runs())
    assert slabs is not None
    words = Words()
    targets = [page(4) + 4, *(page(4) + 16 + 48 * k for k in range(9)), page(5) + 4]
    words.add(np.array(targets, np.uint64), HEAP + 0x50 + 8 * np.arange(len(targets),
                                                                         dtype=np.uint64), None)
    gslice.split(heap_with_pages(), slabs, words)
    assert slabs.slabs[4].color == 16 and slabs.slabs[5].color is None
    assert slabs.whole == 1 and slabs.why == {"where the chunks of 48 bytes start not told": 1}
