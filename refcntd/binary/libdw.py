"""The few libdw (elfutils) calls the DWARF index needs, through ctypes.

Why libdw: walking every DIE in Python (pyelftools) costs ~30 us per DIE,
45 s on perf.  libdw walks the tree in C and skips subtrees by
DW_AT_sibling, so only the answers cross into Python: DIE offsets, which
pyelftools then reads one by one.  libdw.so.1 is Debian's `libdw1`.
Measured against the alternatives in benchmarks/results/bigbinary.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from pathlib import Path

DW_TAG_subprogram = 0x2E
DW_TAG_namespace = 0x39


class Attribute(ctypes.Structure):
    """Dwarf_Attribute from <elfutils/libdw.h>: code, form, value pointer, unit."""

    _fields_ = [("code", ctypes.c_uint), ("form", ctypes.c_uint), ("valp", ctypes.c_void_p),
                ("cu", ctypes.c_void_p)]


class Die(ctypes.Structure):
    """Dwarf_Die from <elfutils/libdw.h>: opaque to us, 32 bytes."""

    _fields_ = [("addr", ctypes.c_void_p), ("cu", ctypes.c_void_p),
                ("abbrev", ctypes.c_void_p), ("padding", ctypes.c_long)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Die), ctypes.c_void_p)


class LibdwUnavailable(Exception):
    """libdw.so.1 is missing or cannot read this file's DWARF."""


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("dw") or "libdw.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as err:
        raise LibdwUnavailable(f"libdw not loadable ({err})") from None
    u64, pdie = ctypes.c_uint64, ctypes.POINTER(Die)
    sigs = {
        "dwarf_begin": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int]),
        "dwarf_end": (ctypes.c_int, [ctypes.c_void_p]),
        "dwarf_nextcu": (ctypes.c_int, [ctypes.c_void_p, u64, ctypes.POINTER(u64),
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p]),
        "dwarf_offdie": (pdie, [ctypes.c_void_p, u64, pdie]),
        "dwarf_child": (ctypes.c_int, [pdie, pdie]),
        "dwarf_siblingof": (ctypes.c_int, [pdie, pdie]),
        "dwarf_tag": (ctypes.c_int, [pdie]),
        "dwarf_diename": (ctypes.c_char_p, [pdie]),
        "dwarf_dieoffset": (u64, [pdie]),
        "dwarf_lowpc": (ctypes.c_int, [pdie, ctypes.POINTER(u64)]),
        "dwarf_addrdie": (pdie, [ctypes.c_void_p, u64, pdie]),
        "dwarf_func_inline_instances": (ctypes.c_int, [pdie, _CALLBACK, ctypes.c_void_p]),
        "dwarf_hasattr": (ctypes.c_int, [pdie, ctypes.c_uint]),
        "dwarf_attr_integrate": (ctypes.POINTER(Attribute),
                                 [pdie, ctypes.c_uint, ctypes.POINTER(Attribute)]),
        "dwarf_formudata": (ctypes.c_int, [ctypes.POINTER(Attribute), ctypes.POINTER(u64)]),
        "dwarf_formref_die": (pdie, [ctypes.POINTER(Attribute), pdie]),
        "dwarf_aggregate_size": (ctypes.c_int, [pdie, ctypes.POINTER(u64)]),
    }
    for fname, (res, args) in sigs.items():
        fn = getattr(lib, fname)
        fn.restype, fn.argtypes = res, args
    return lib


_LIB: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    global _LIB
    if _LIB is None:
        _LIB = _load()
    return _LIB


class Dwarf:
    """One file's DWARF, opened read-only; a context manager."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._lib = lib()
        self._fd = os.open(Path(path), os.O_RDONLY)
        self._dbg = self._lib.dwarf_begin(self._fd, 0)  # DWARF_C_READ
        if not self._dbg:
            os.close(self._fd)
            raise LibdwUnavailable(f"libdw cannot read the DWARF of {path}")

    def __enter__(self) -> Dwarf:
        return self

    def __exit__(self, *exc: object) -> None:
        self._lib.dwarf_end(self._dbg)
        os.close(self._fd)

    def unit_offsets(self) -> Iterator[tuple[int, int, int]]:
        """(unit header offset, unit DIE offset, abbreviation table offset) of every unit."""
        off, nxt, hsize, abbrev = 0, ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_uint64()
        while self._lib.dwarf_nextcu(self._dbg, off, ctypes.byref(nxt), ctypes.byref(hsize),
                                     ctypes.byref(abbrev), None, None) == 0:
            yield off, off + hsize.value, abbrev.value
            off = nxt.value

    def die_at(self, offset: int) -> Die | None:
        die = Die()
        return die if self._lib.dwarf_offdie(self._dbg, offset, ctypes.byref(die)) else None

    def unit_at_address(self, vaddr: int) -> Die | None:
        die = Die()
        found = self._lib.dwarf_addrdie(self._dbg, vaddr, ctypes.byref(die))
        return die if found else None

    def top_functions(self, unit: Die) -> Iterator[Die]:
        """Subprogram DIEs at unit level (and inside namespaces), skipping every subtree."""
        child = Die()
        if self._lib.dwarf_child(ctypes.byref(unit), ctypes.byref(child)) != 0:
            return
        while True:
            tag = self._lib.dwarf_tag(ctypes.byref(child))
            if tag == DW_TAG_subprogram:
                yield Die.from_buffer_copy(child)
            elif tag == DW_TAG_namespace:
                yield from self.top_functions(Die.from_buffer_copy(child))
            if self._lib.dwarf_siblingof(ctypes.byref(child), ctypes.byref(child)) != 0:
                return

    def name(self, die: Die) -> str:
        """The name, following abstract_origin and specification (libdw's rule)."""
        raw = self._lib.dwarf_diename(ctypes.byref(die))
        return raw.decode(errors="replace") if raw else ""

    def offset(self, die: Die) -> int:
        return int(self._lib.dwarf_dieoffset(ctypes.byref(die)))

    def low_pc(self, die: Die) -> int | None:
        value = ctypes.c_uint64()
        if self._lib.dwarf_lowpc(ctypes.byref(die), ctypes.byref(value)) != 0:
            return None
        return value.value

    def inline_instances(self, function: Die) -> list[int]:
        """Offsets of the DW_TAG_inlined_subroutine DIEs of `function` in its unit."""
        found: list[int] = []

        def note(die: ctypes._Pointer[Die], _arg: object) -> int:
            found.append(int(self._lib.dwarf_dieoffset(die)))
            return 0  # DWARF_CB_OK

        callback = _CALLBACK(note)
        self._lib.dwarf_func_inline_instances(ctypes.byref(function), callback, None)
        return found

    def children(self, die: Die) -> Iterator[Die]:
        """The DIE's children, each a copy (the next one is read into a buffer of its own)."""
        child = Die()
        if self._lib.dwarf_child(ctypes.byref(die), ctypes.byref(child)) != 0:
            return
        while True:
            yield Die.from_buffer_copy(child)
            if self._lib.dwarf_siblingof(ctypes.byref(child), ctypes.byref(child)) != 0:
                return

    def tag(self, die: Die) -> int:
        return int(self._lib.dwarf_tag(ctypes.byref(die)))

    def has(self, die: Die, attribute: int) -> bool:
        return bool(self._lib.dwarf_hasattr(ctypes.byref(die), attribute))

    def udata(self, die: Die, attribute: int) -> int | None:
        """A constant attribute (a member's DW_AT_data_member_location)."""
        attr, value = Attribute(), ctypes.c_uint64()
        if not self._lib.dwarf_attr_integrate(ctypes.byref(die), attribute, ctypes.byref(attr)):
            return None
        if self._lib.dwarf_formudata(ctypes.byref(attr), ctypes.byref(value)) != 0:
            return None
        return value.value

    def ref(self, die: Die, attribute: int) -> Die | None:
        """The DIE a reference attribute (DW_AT_type) names."""
        attr, out = Attribute(), Die()
        if not self._lib.dwarf_attr_integrate(ctypes.byref(die), attribute, ctypes.byref(attr)):
            return None
        return out if self._lib.dwarf_formref_die(ctypes.byref(attr), ctypes.byref(out)) \
            else None

    def size(self, die: Die) -> int | None:
        """The byte size of a type (through typedefs, qualifiers and arrays)."""
        value = ctypes.c_uint64()
        if self._lib.dwarf_aggregate_size(ctypes.byref(die), ctypes.byref(value)) != 0:
            return None
        return value.value
