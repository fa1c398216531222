"""Classes read from memory (reach/gtypes.py), on GLib's structures laid out by hand in
this very process (ProcessMemory reads oneself without root): the statics where
Debian's libgobject and libglib keep them (decoded from their code by
binary/gtypelayout.py), TypeNodes, classes, quark strings and instances on a fake
heap.  Then the same memory made hostile: every bad word gives no name, never an
exception, and nothing is followed twice."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from pathlib import Path

import pytest

from refcntd.binary.gtypelayout import GObjectLayout, QuarkLayout, gobject_layout, quark_layout
from refcntd.inputs.spec import ClassSource, KeptFlag
from refcntd.reach import gtypes
from refcntd.reach.memory import Mapping, ProcessMemory

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
GOBJECT, GLIB = LIBDIR / "libgobject-2.0.so.0", LIBDIR / "libglib-2.0.so.0"
G_TYPE_OBJECT = 20 << 2  # a fundamental GType
INSTANCE, FIELD0 = ClassSource(instance=True), ClassSource(offset=0)


class Area:
    """An anonymous mapping of this process, written by offset."""

    def __init__(self, size: int) -> None:
        self.size = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        self.map = mmap.mmap(-1, self.size)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.used = 0

    def put(self, offset: int, data: bytes) -> int:
        self.map[offset:offset + len(data)] = data
        return self.base + offset

    def add(self, data: bytes) -> int:
        """At the next free 16-byte-aligned offset: its address."""
        at = self.used
        self.used = (at + len(data) + 15) // 16 * 16
        return self.put(at, data)


def q(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *words)


class FakeGlib:
    """libgobject's and libglib's statics, and a heap of type nodes and objects."""

    def __init__(self, layout: GObjectLayout, quarks: QuarkLayout) -> None:
        self.layout = layout
        self.gobject = Area(layout.fundamental_nodes + 8 * 256)
        self.glib = Area(max(quarks.seq_id, quarks.quarks) + 16)
        self.heap = Area(1 << 16)
        self.strings: list[int] = [0]  # quark 0 is no quark
        self.ancestry: dict[int, tuple[int, ...]] = {}  # GType -> supers[] before the 0
        self.quark_array = self.heap.add(b"\0" * 8 * 64)
        self.glib.put(quarks.quarks, q(self.quark_array))
        self.seq_at = quarks.seq_id
        self._count()

    def _count(self) -> None:
        self.glib.put(self.seq_at, struct.pack("<I", len(self.strings)))

    def quark(self, name: bytes) -> int:
        self.strings.append(self.heap.add(name + b"\0"))
        index = len(self.strings) - 1
        self.heap.put(self.quark_array - self.heap.base + 8 * index, q(self.strings[-1]))
        self._count()
        return index

    def node(self, name: bytes, fundamental: int = 0, parent: int = 0) -> int:
        """A TypeNode named `name`: its GType (the node's address, or `fundamental`);
        its supers[] are its GType, `parent`'s supers[] and their 0, as GLib copies them."""
        ancestors = self.ancestry[parent] if parent else ()
        size = self.layout.supers + 8 * (len(ancestors) + 2)
        raw = bytearray(size)
        raw[self.layout.qname:self.layout.qname + 4] = struct.pack("<I", self.quark(name))
        node = self.heap.add(bytes(raw))
        gtype = fundamental or node
        self.ancestry[gtype] = (gtype, *ancestors)
        self.heap.put(node - self.heap.base + self.layout.supers, q(gtype, *ancestors, 0))
        if fundamental:
            self.gobject.put(self.layout.fundamental_nodes + (fundamental >> 2) * 8, q(node))
        return gtype

    def instance(self, gtype: int) -> int:
        cls = self.heap.add(q(gtype, 0, 0, 0))
        return self.heap.add(q(cls, 1, 0))

    def maps(self) -> list[Mapping]:
        return [Mapping(self.gobject.base, self.gobject.base + self.gobject.size, "rw-p", 0,
                        os.stat(GOBJECT).st_ino, str(GOBJECT.resolve())),
                Mapping(self.glib.base, self.glib.base + self.glib.size, "rw-p", 0,
                        os.stat(GLIB).st_ino, str(GLIB.resolve())),
                Mapping(self.heap.base, self.heap.base + self.heap.size, "rw-p", 0, 0,
                        "[heap]")]


@pytest.fixture
def glib(tmp_path: Path) -> tuple[FakeGlib, Path]:
    layout, quarks = gobject_layout(str(GOBJECT)), quark_layout(str(GLIB))
    assert layout is not None and quarks is not None, "Debian's GLib 2.74 (scripts/setup.sh)"
    proc = tmp_path / "proc"
    (proc / str(os.getpid())).mkdir(parents=True)
    (proc / str(os.getpid()) / "root").symlink_to("/")  # the libraries as we see them
    return FakeGlib(layout, quarks), proc


def names(fake: FakeGlib, proc: Path, objects: dict[int, ClassSource]) -> gtypes.ClassNames:
    mem = ProcessMemory(os.getpid())
    try:
        return gtypes.read_class_names(mem, fake.maps(), objects, proc)
    finally:
        mem.close()


# GLib as Debian builds it, by the file the soname names: what objdump shows in g_type_name
# (the fundamental nodes, TypeNode.qname) and g_quark_to_string (quark_seq_id, quarks).
DEBIAN_LAYOUTS = {
    "libgobject-2.0.so.0.7400.6": GObjectLayout(0x3fc, 0x5e3a0, 0x28, 0x48, 0),  # Debian 12
    "libglib-2.0.so.0.7400.6": QuarkLayout(0x137d18, 0x137d20, 0),
    "libgobject-2.0.so.0.8400.4": GObjectLayout(0x3fc, 0x62380, 0x20, 0x40, 0),  # Debian 13
    "libglib-2.0.so.0.8400.4": QuarkLayout(0x157cc8, 0x157cd0, 0),
}


def test_debian_layouts_are_decoded() -> None:
    """The layouts of the GLib installed here, read from its code, equal objdump's."""
    gobject, glib = GOBJECT.resolve().name, GLIB.resolve().name
    known = [n for n in (gobject, glib) if n in DEBIAN_LAYOUTS]
    assert known == [gobject, glib], f"no objdump layout noted for {gobject} or {glib}"
    assert gobject_layout(str(GOBJECT)) == DEBIAN_LAYOUTS[gobject]
    assert quark_layout(str(GLIB)) == DEBIAN_LAYOUTS[glib]


def test_other_code_gives_no_layout() -> None:
    """A library whose functions are not GLib's (or absent) is refused, not guessed."""
    assert gobject_layout(str(GLIB)) is None
    assert quark_layout("/bin/true") is None
    assert gobject_layout("/nonexistent/libgobject-2.0.so.0") is None


def test_derived_fundamental_and_field_types_are_named(glib) -> None:
    fake, proc = glib
    parser = fake.node(b"JsonParser")
    plain = fake.node(b"GObject", fundamental=G_TYPE_OBJECT)
    caps = fake.node(b"GstCaps")
    a, b, c = fake.instance(parser), fake.instance(parser), fake.instance(plain)
    mini = fake.heap.add(q(caps, 0x100000001))
    found = names(fake, proc, {a: INSTANCE, b: INSTANCE, c: INSTANCE, mini: FIELD0})
    assert found.names == {a: "JsonParser", b: "JsonParser", c: "GObject", mini: "GstCaps"}
    assert (found.unread, found.problem) == (0, "")


def test_hostile_words_give_no_name(glib) -> None:
    """Each link broken once; the good object beside them is still named."""
    fake, proc = glib
    good = fake.instance(fake.node(b"GTask"))
    unmapped = fake.heap.add(q(0x10))  # class pointer into nothing
    odd = fake.heap.add(q(fake.heap.base + 3))  # unaligned class pointer
    forged = fake.heap.add(b"\0" * 0x100)  # a "node" whose supers[0] is not its GType
    not_a_node = fake.instance(forged)
    bad_quark = fake.node(b"Fine")
    fake.heap.put(bad_quark - fake.heap.base + fake.layout.qname, struct.pack("<I", 9999))
    garbage = fake.node(b"\xff\xfe not a type name")
    short = fake.node(b"ab")  # GLib refuses names under 3 characters
    self_loop = fake.heap.add(b"\0" * 16)
    fake.heap.put(self_loop - fake.heap.base, q(self_loop))  # its class is itself
    unnamed_fundamental = fake.instance(G_TYPE_OBJECT)  # no node registered there
    objects = {good: INSTANCE, unmapped: INSTANCE, odd: INSTANCE, not_a_node: INSTANCE,
               fake.instance(bad_quark): INSTANCE, fake.instance(garbage): INSTANCE,
               fake.instance(short): INSTANCE, self_loop: INSTANCE,
               unnamed_fundamental: INSTANCE, 0x10: INSTANCE, 0: FIELD0, good + 4: INSTANCE}
    found = names(fake, proc, objects)
    assert found.names == {good: "GTask"}
    assert found.unread == len(objects) - 1


def test_a_name_without_its_end_is_refused(glib) -> None:
    """A name running off its mapping, or longer than any GLib name, is not read."""
    fake, proc = glib
    long = fake.node(b"A" * 300)
    found = names(fake, proc, {fake.instance(long): INSTANCE})
    assert found.names == {}


def test_quark_count_beyond_reason_names_nothing(glib) -> None:
    fake, proc = glib
    obj = fake.instance(fake.node(b"GTask"))
    fake.glib.put(fake.seq_at, struct.pack("<I", 0))
    assert names(fake, proc, {obj: INSTANCE}).names == {}


def test_without_libgobject_every_object_keeps_its_type(glib) -> None:
    fake, proc = glib
    obj = fake.instance(fake.node(b"GTask"))
    mem = ProcessMemory(os.getpid())
    found = gtypes.read_class_names(mem, fake.maps()[1:], {obj: INSTANCE}, proc)
    assert (found.names, found.unread) == ({}, 1)
    assert "libgobject-2.0.so not mapped" in found.problem
    assert gtypes.note(found) == ["classes not read (libgobject-2.0.so not mapped): 1 "
                                  "object(s) named by the spec's type only"]


def test_reads_are_one_per_object_batch_and_a_few_per_class(glib) -> None:
    """2 000 objects of 3 classes: two gathers (objects, classes) and ~4 reads a class."""
    fake, proc = glib
    types = [fake.node(n) for n in (b"GstBuffer", b"GstCaps", b"GstEvent")]
    objects = {fake.heap.add(q(types[i % 3], 0)): FIELD0 for i in range(2000)}
    mem = ProcessMemory(os.getpid())
    found = gtypes.read_class_names(mem, fake.maps(), objects, proc)
    assert len(found.names) == 2000
    assert mem.reads <= 2 + 1 + 3 * 4  # 2 gathers of <=1024, the quark table, 3 classes


def test_a_file_named_like_glib_that_is_not_gives_no_layout(tmp_path) -> None:
    """What a hostile process may map under GLib's name: garbage, a truncated copy,
    another library; never an exception."""
    raw = GOBJECT.resolve().read_bytes()
    for name, data in [("garbage", b"\x7fELF" + os.urandom(5000)),
                       ("truncated", raw[:len(raw) // 3]), ("zeros", bytes(70000))]:
        path = tmp_path / f"libgobject-2.0.so.0.{name}"
        path.write_bytes(data)
        assert gobject_layout(str(path)) is None and quark_layout(str(path)) is None


def test_random_memory_names_nothing_and_raises_nothing(glib) -> None:
    """A heap of random words, with pointers into itself and into GLib's statics
    sprinkled in: 2 000 objects read, none named, no exception."""
    fake, proc = glib
    rng = __import__("random").Random(54)
    targets = [fake.heap.base, fake.gobject.base + fake.layout.fundamental_nodes,
               fake.quark_array, 0, 2**64 - 8]
    words = [rng.choice(targets) + rng.randrange(0, 4096, 4) if rng.random() < 0.5
             else rng.getrandbits(64) for _ in range(6000)]
    start = fake.heap.add(struct.pack(f"<{len(words)}Q", *(w % 2**64 for w in words)))
    objects = {start + 8 * rng.randrange(len(words)): rng.choice([INSTANCE, FIELD0])
               for _ in range(2000)}
    found = names(fake, proc, objects)
    assert found.names == {} and found.unread == len(objects)


GST_FLAGS = 48  # GstObject.flags: GObject (24 bytes), lock, name, parent
MAY_BE_LEAKED = ClassSource(instance=True, kept=KeptFlag("GstObject", GST_FLAGS, 1))


def gst_object(fake: FakeGlib, gtype: int, flags: int) -> int:
    """An instance of `gtype` whose word at GST_FLAGS is `flags`."""
    cls = fake.heap.add(q(gtype, 0, 0, 0))
    return fake.heap.add(q(cls, 1, 0, 0, 0, 0, flags))


def gst_types(fake: FakeGlib) -> dict[str, int]:
    """GObject <- GInitiallyUnowned <- GstObject <- GstElement <- GstPipeline, and GTask."""
    out = {"GObject": fake.node(b"GObject", fundamental=G_TYPE_OBJECT)}
    for name, parent in [("GInitiallyUnowned", "GObject"), ("GstObject", "GInitiallyUnowned"),
                         ("GstElement", "GstObject"), ("GstPipeline", "GstElement"),
                         ("GTask", "GObject")]:
        out[name] = fake.node(name.encode(), parent=out[parent])
    return out


def test_the_flag_is_read_on_objects_whose_class_is_a_the_type(glib) -> None:
    """GLib's is-a from supers[]: a flagged GstPipeline and GstObject are kept; the
    same bit on a GTask (not a GstObject), a clear flag, another bit, and an object
    whose source reads no flag are not."""
    fake, proc = glib
    t = gst_types(fake)
    pipeline, obj = gst_object(fake, t["GstPipeline"], 1), gst_object(fake, t["GstObject"], 0x21)
    clear, other_bit = gst_object(fake, t["GstElement"], 0), gst_object(fake, t["GstElement"], 2)
    task, unasked = gst_object(fake, t["GTask"], 1), gst_object(fake, t["GstPipeline"], 1)
    high = gst_object(fake, t["GstPipeline"], 1 << 32)  # the 32-bit word's neighbour
    found = names(fake, proc, {pipeline: MAY_BE_LEAKED, obj: MAY_BE_LEAKED,
                               clear: MAY_BE_LEAKED, other_bit: MAY_BE_LEAKED,
                               task: MAY_BE_LEAKED, unasked: INSTANCE, high: MAY_BE_LEAKED})
    assert sorted(found.kept) == sorted([pipeline, obj])
    assert found.names[pipeline] == "GstPipeline" and found.names[task] == "GTask"


def test_the_ancestry_read_from_the_nodes_as_glib_lays_them_out(glib) -> None:
    fake, proc = glib
    t = gst_types(fake)
    mem = ProcessMemory(os.getpid())
    try:
        found = gtypes._globals(os.getpid(), fake.maps(), proc)
        assert not isinstance(found, str), found
        reader = gtypes._Reader(mem, fake.maps(), found)
        assert reader.ancestry(t["GstPipeline"]) == (
            t["GstPipeline"], t["GstElement"], t["GstObject"], t["GInitiallyUnowned"],
            G_TYPE_OBJECT)
        assert reader.ancestry(G_TYPE_OBJECT) == (G_TYPE_OBJECT,)
        assert [reader.is_a(t["GstPipeline"], n) for n in ("GstObject", "GObject", "GTask")] \
            == [True, True, False]
    finally:
        mem.close()


def test_a_forged_ancestry_keeps_nothing(glib) -> None:
    """Each lie once: an ancestor named GstObject whose own supers[] are not the
    tail of the chain, supers[] without their 0 up to the mapping's end, an ancestor
    whose node is not one, a node whose supers[0] is not its GType."""
    fake, proc = glib
    t = gst_types(fake)
    impostor = fake.node(b"GstObject", parent=t["GTask"])  # named so, another lineage
    liar = fake.node(b"GstBin", parent=t["GstElement"])
    base = liar - fake.heap.base + fake.layout.supers
    fake.heap.put(base, q(liar, impostor, t["GObject"], 0))  # claims impostor as parent
    nowhere = fake.node(b"GstNowhere", parent=t["GstObject"])
    fake.heap.put(nowhere - fake.heap.base + fake.layout.supers + 8, q(0x10))
    misfiled = fake.node(b"GstMisfiled", parent=t["GstObject"])
    fake.heap.put(misfiled - fake.heap.base + fake.layout.supers, q(t["GstObject"]))
    at = fake.heap.size - fake.layout.supers - 64  # the heap's last bytes: supers[]
    endless = fake.heap.base + at  # without their 0 up to the end of the mapping
    fake.heap.put(at + fake.layout.qname, struct.pack("<I", fake.quark(b"GstEndless")))
    fake.heap.put(at + fake.layout.supers, q(endless, *[t["GstObject"]] * 7))
    objects = {gst_object(fake, g, 1): MAY_BE_LEAKED
               for g in (liar, endless, nowhere, misfiled)}
    good = gst_object(fake, t["GstElement"], 1)
    found = names(fake, proc, {**objects, good: MAY_BE_LEAKED})
    assert found.kept == [good]
    assert found.names[next(iter(objects))] == "GstBin"  # named, only not kept
