"""Each tracked object's class, read from a stopped process's memory: a GObject's GType
name (`g_type_name_from_instance`), a GstMiniObject's (`type` field), as GLib itself
would answer, without calling into the process.

    instance -> g_class -> GType -> TypeNode -> qname -> quarks[qname] -> "JsonParser"

Where GLib keeps the fundamental nodes and the quark strings, and the TypeNode's
offsets, come from the code of the libgobject and libglib the process maps
(binary/gtypelayout.py).  The memory is the traced program's: every word is checked
before it is followed (inside a readable mapping, aligned, a node whose `supers[0]`
is the GType that led to it, a quark below GLib's count, a name as GLib allows
them), nothing is followed twice or in a loop, and an object whose class cannot be
read keeps the spec's type name.  Cost: one word per object (IOV_MAX per system
call) and about four reads per distinct class.

A `class:` with `may_be_leaked: {is_a: T, offset, mask}` also asks whether each such
object's class is-a T and, if so, for the library's "may be leaked" word at +offset
(GstObject.flags): the objects flagged are `kept`, set aside by the caller.  Is-a
follows GLib's NODE_IS_ANCESTOR: the node's `supers[]` lists the GType, its parent,
... the fundamental, then 0 (type_node_any_new_W copies the parent's, terminator
included); T is one of them whose own node names it T and whose own `supers[]` is the
tail of this one.  Cost: one read per distinct class and one word per object of it.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refcntd.binary.gtypelayout import (
    GObjectLayout,
    QuarkLayout,
    gobject_layout,
    quark_layout,
)
from refcntd.inputs.spec import ClassSource
from refcntd.reach.memory import Mapping, ProcessMemory, read_maps

GOBJECT_LIB, GLIB_LIB = "libgobject-2.0.so", "libglib-2.0.so"
GOBJECT_SONAME, GLIB_SONAME = f"{GOBJECT_LIB}.0", f"{GLIB_LIB}.0"
MAX_NAME = 128  # bytes of a type name read (GLib's names are identifiers)
MAX_TYPES = 4096  # distinct GTypes named per scan; further ones are not read
MAX_QUARKS = 1 << 24  # a quark count above this is not GLib's
NAME_RE = re.compile(rb"[A-Za-z_][A-Za-z0-9_+-]{2,}")  # GLib's check_type_name_I
MAX_SUPERS = 257  # supers[] words read: a node's GType, 255 ancestors (MAX_N_SUPERS), 0


@dataclass
class ClassNames:
    """What a read found: the class of each object named, and why others were not."""

    names: dict[int, str] = field(default_factory=dict)  # object address -> class
    kept: list[int] = field(default_factory=list)  # objects the library flags "may be
    #                                                leaked" (ClassSource.kept)
    unread: int = 0  # objects whose class could not be read (they keep the type name)
    problem: str = ""  # why none could be (no libgobject mapped, its code not as expected)
    reads: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class _Globals:
    """libgobject's and libglib's statics, at the addresses this process maps them."""

    gobject: GObjectLayout
    gobject_base: int
    quarks: QuarkLayout
    glib_base: int


def read_classes(pid: int, objects: dict[int, ClassSource],
                 proc: Path = Path("/proc")) -> ClassNames:
    """read_class_names on `pid` (stopped by the caller at exit and for GET /leaks;
    running for refcntd_live_objects_by_class: the checks make a torn read harmless),
    timed."""
    began = time.monotonic()
    mem = ProcessMemory(pid, proc)
    try:
        out = read_class_names(mem, read_maps(pid, proc), objects, proc)
    finally:
        mem.close()
    out.reads, out.seconds = mem.reads, time.monotonic() - began
    return out


def prepare(gobject: str, glib: str) -> None:
    """Decode both libraries' layouts ahead (remembered per file version)."""
    gobject_layout(gobject)
    quark_layout(glib)


def prepare_for(pid: int, proc: Path = Path("/proc")) -> None:
    """prepare() for the copies `pid` maps, read while it runs (before a stop)."""
    _globals(pid, read_maps(pid, proc), proc)


def note(found: ClassNames) -> list[str]:
    """The report's note when classes could not be read (none when all were)."""
    if found.problem and found.unread:
        return [f"classes not read ({found.problem}): {found.unread} object(s) named by "
                "the spec's type only"]
    if found.unread:
        return [f"{found.unread} object(s) whose class could not be read from their "
                "memory (freed, or not what the spec says): named by the spec's type"]
    return []


def read_class_names(mem: ProcessMemory, maps: list[Mapping], objects: dict[int, ClassSource],
                     proc: Path = Path("/proc")) -> ClassNames:
    """The class of each object (address -> where its class is): those that pass
    every check."""
    out = ClassNames()
    found = _globals(mem.pid, maps, proc)
    if isinstance(found, str):
        out.problem, out.unread = found, len(objects)
        return out
    reader = _Reader(mem, maps, found)
    out.names = reader.names(objects)
    out.unread = len(objects) - len(out.names)
    out.kept = reader.kept(objects)
    return out


def _globals(pid: int, maps: list[Mapping], proc: Path) -> _Globals | str:
    """Both libraries' layouts and load addresses, or why not."""
    gobject = _mapped(maps, GOBJECT_LIB)
    glib = _mapped(maps, GLIB_LIB)
    if gobject is None or glib is None:
        return f"{GOBJECT_LIB if gobject is None else GLIB_LIB} not mapped"
    g_layout = gobject_layout(_file(pid, gobject, proc))
    q_layout = quark_layout(_file(pid, glib, proc))
    if g_layout is None or q_layout is None:
        lib = gobject.path if g_layout is None else glib.path
        return f"{lib}: its g_type_name/g_quark_to_string are not as refcntd knows them"
    return _Globals(g_layout, gobject.start - g_layout.min_vaddr,
                    q_layout, glib.start - q_layout.min_vaddr)


def _mapped(maps: list[Mapping], prefix: str) -> Mapping | None:
    """The first mapping (file offset 0) of the library whose file name starts so."""
    for m in maps:
        if m.offset == 0 and m.inode and Path(m.path).name.startswith(prefix):
            return m
    return None


def _file(pid: int, m: Mapping, proc: Path) -> str:
    """The file mapped there, as the process sees it (its own mount namespace)."""
    direct = proc / str(pid) / "map_files" / f"{m.start:x}-{m.end:x}"
    return str(direct) if direct.exists() else str(proc / str(pid) / "root") + m.path


class _Reader:
    """Reads of one process, each address checked against its readable mappings."""

    def __init__(self, mem: ProcessMemory, maps: list[Mapping], where: _Globals) -> None:
        self.mem, self.where = mem, where
        readable = sorted((m.start, m.end) for m in maps if m.perms.startswith("r"))
        self._starts = [s for s, _ in readable]
        self._ends = [e for _, e in readable]
        self._starts_array = np.array(self._starts, np.uint64)
        self._ends_array = np.array(self._ends, np.uint64)
        self._by_gtype: dict[int, str | None] = {}
        self._quarks: tuple[int, int] | None = None  # (count, array), read once
        self._gtype_of: dict[int, int] = {}  # object -> its GType (those named)
        self._supers: dict[int, tuple[int, ...] | None] = {}
        self._is_a: dict[tuple[int, str], bool] = {}

    def names(self, objects: dict[int, ClassSource]) -> dict[int, str]:
        where = {a: a + s.offset for a, s in objects.items()}
        addresses = [a for a, ok in zip(where, self.all_readable(list(where.values())),
                                        strict=True) if ok]
        firsts = dict(zip(addresses, self.mem.gather([where[a] for a in addresses]),
                          strict=True))
        pointers = sorted({w for a, w in firsts.items() if w is not None
                           and objects[a].instance})
        classes = [c for c, ok in zip(pointers, self.all_readable(pointers), strict=True)
                   if ok]
        gtypes_of = dict(zip(classes, self.mem.gather(classes), strict=True))
        out = {}
        for address, first in firsts.items():
            gtype = gtypes_of.get(first) if objects[address].instance and first else first
            if gtype and (name := self.type_name(gtype)) is not None:
                out[address] = name
                self._gtype_of[address] = gtype
        return out

    def kept(self, objects: dict[int, ClassSource]) -> list[int]:
        """After names(): the objects whose class is-a their source's `kept.is_a` and
        whose flag word has a bit of its mask set."""
        flagged = {a: s.kept for a, s in objects.items() if s.kept is not None
                   and a in self._gtype_of and self.is_a(self._gtype_of[a], s.kept.is_a)}
        where = {a: a + (k.offset & ~7) for a, k in flagged.items()}
        wanted = [a for a, ok in zip(where, self.all_readable(list(where.values())),
                                     strict=True) if ok]
        words = self.mem.gather([where[a] for a in wanted])
        return [a for a, word in zip(wanted, words, strict=True) if word is not None
                and (word >> (8 * (flagged[a].offset % 8))) & flagged[a].mask]

    def is_a(self, gtype: int, name: str) -> bool:
        """g_type_is_a(gtype, the type named `name`), from the nodes' supers[]."""
        key = (gtype, name)
        if key not in self._is_a:
            chain = self.ancestry(gtype) or ()
            self._is_a[key] = any(self.type_name(t) == name and self.ancestry(t) == chain[k:]
                                  for k, t in enumerate(chain))
        return self._is_a[key]

    def ancestry(self, gtype: int) -> tuple[int, ...] | None:
        """The GType and its ancestors, itself first (the node's supers[] up to its 0)."""
        if gtype not in self._supers:
            if len(self._supers) >= MAX_TYPES:
                return None
            self._supers[gtype] = self._read_supers(gtype)
        return self._supers[gtype]

    def _read_supers(self, gtype: int) -> tuple[int, ...] | None:
        node = self._node(gtype)
        start = node + self.where.gobject.supers if node is not None else 1
        i = bisect_right(self._starts, start) - 1
        if start % 8 or i < 0 or start >= self._ends[i]:
            return None
        words = self.mem.words(start, min(MAX_SUPERS, (self._ends[i] - start) // 8))
        if not words or words[0] != gtype or 0 not in words:  # NODE_TYPE; terminated
            return None
        return tuple(words[:words.index(0)])

    def all_readable(self, addresses: list[int]) -> list[bool]:
        """readable(a, 8) of each, at once."""
        if not addresses or not self._starts:
            return [False] * len(addresses)
        where = np.array(addresses, np.uint64)
        i = np.searchsorted(self._starts_array, where, "right") - 1
        ends = self._ends_array[np.maximum(i, 0)]
        ok = (i >= 0) & (where % np.uint64(8) == 0) & (where + np.uint64(8) <= ends) \
            & (where < np.uint64(2**64 - 8))
        return ok.tolist()  # type: ignore[no-any-return]

    def readable(self, address: int, size: int) -> bool:
        if address % 8:
            return False
        i = bisect_right(self._starts, address) - 1
        return i >= 0 and address + size <= self._ends[i]

    def type_name(self, gtype: int) -> str | None:
        if gtype not in self._by_gtype:
            if len(self._by_gtype) >= MAX_TYPES:
                return None
            self._by_gtype[gtype] = self._read_name(gtype)
        return self._by_gtype[gtype]

    def _read_name(self, gtype: int) -> str | None:
        layout = self.where.gobject
        node = self._node(gtype)
        if node is None or not self.readable(node, layout.supers + 8):
            return None
        words = self.mem.words(node, layout.supers // 8 + 1)
        if words is None or words[-1] != gtype:  # NODE_TYPE(node): supers[0]
            return None
        qname = (words[layout.qname // 8] >> (8 * (layout.qname % 8))) & 0xFFFFFFFF
        return self._quark(qname)

    def _node(self, gtype: int) -> int | None:
        """The TypeNode of `gtype` (lookup_type_node_I)."""
        layout = self.where.gobject
        if gtype > layout.fundamental_max:
            return gtype & ~3
        slot = self.where.gobject_base + layout.fundamental_nodes + (gtype >> 2) * 8
        return self.mem.word(slot) if self.readable(slot, 8) else None

    def _quark(self, quark: int) -> str | None:
        """g_quark_to_string: the string, if it is a type name GLib would accept."""
        count, array = self._quark_table()
        if not 0 < quark < count or not self.readable(array + 8 * quark, 8):
            return None
        pointer = self.mem.word(array + 8 * quark)
        if not pointer or not self._readable_byte(pointer):
            return None
        raw, end, _ = self.mem.read(pointer, MAX_NAME).partition(b"\0")
        return raw.decode() if end and NAME_RE.fullmatch(raw) else None  # ended in MAX_NAME

    def _readable_byte(self, address: int) -> bool:
        i = bisect_right(self._starts, address) - 1
        return i >= 0 and address < self._ends[i]

    def _quark_table(self) -> tuple[int, int]:
        """(quark_seq_id, quarks), read once; (0, 0) when they make no sense."""
        if self._quarks is None:
            layout, base = self.where.quarks, self.where.glib_base
            count = self._u32(base + layout.seq_id)
            array = self.mem.word(base + layout.quarks) \
                if self.readable(base + layout.quarks, 8) else None
            self._quarks = (count, array) if count and array and count <= MAX_QUARKS \
                else (0, 0)
        return self._quarks

    def _u32(self, address: int) -> int | None:
        if address % 4 or not self.readable(address & ~7, 8):
            return None
        data = self.mem.read(address, 4)
        return int.from_bytes(data, "little") if len(data) == 4 else None
