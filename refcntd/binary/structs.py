"""A struct member by offset, from DWARF: `map 0x55d0..+0x20` becomes `map 0x55d0.. .dso`.

A holder inside another tracked object is named by the member that holds the pointer
(reach/holders.py).  The struct is looked for by the object's type name (`struct dso`,
or a typedef of a struct: `GObject`) in the compile unit of a function that allocated
it: one unit's top-level DIEs, not the whole file's (perf has 1.6 million DIEs), read
with libdw.  A module without DWARF, or a type it does not define there, gives None
and the holder keeps its offset.
"""

from __future__ import annotations

from collections.abc import Iterable

from refcntd.binary.libdw import Die, Dwarf, LibdwUnavailable

DW_TAG_array_type, DW_TAG_member, DW_TAG_structure_type = 0x01, 0x0D, 0x13
DW_TAG_typedef, DW_TAG_union_type = 0x16, 0x17
DW_TAG_const_type, DW_TAG_volatile_type = 0x26, 0x35
DW_AT_data_member_location, DW_AT_declaration, DW_AT_type = 0x38, 0x3C, 0x49
MAX_DEPTH = 6  # nested structs followed (a hostile DWARF cannot loop us)


class StructNames:
    """Member paths of the tracked types, one DWARF file open per module while it is
    used (a context manager: a report's holders, then closed)."""

    def __init__(self) -> None:
        self._open: dict[str, Dwarf | None] = {}
        self._structs: dict[tuple[str, str], Die | None] = {}
        self._members: dict[tuple[str, str, int], str | None] = {}

    def member(self, module: str, vaddrs: Iterable[int], type_name: str, offset: int
               ) -> str | None:
        """`.rb_node.rb_right`: the member of `type_name` at `offset`, the struct found
        in the unit of the first of `vaddrs` (addresses in `module`) defining it."""
        key = (module, type_name, offset)
        if key not in self._members:  # a report names the same member of many objects
            dwarf = self._dwarf(module)
            struct = self._struct(dwarf, module, list(vaddrs), type_name) if dwarf else None
            self._members[key] = _path(dwarf, struct, offset) \
                if dwarf is not None and struct is not None else None
        return self._members[key]

    def __enter__(self) -> StructNames:
        return self

    def __exit__(self, *exc: object) -> None:
        for dwarf in self._open.values():
            if dwarf is not None:
                dwarf.__exit__()
        self._open.clear()
        self._structs.clear()
        self._members.clear()

    def _dwarf(self, module: str) -> Dwarf | None:
        if module not in self._open:
            try:
                self._open[module] = Dwarf(module)
            except (OSError, LibdwUnavailable):
                self._open[module] = None
        return self._open[module]

    def _struct(self, dwarf: Dwarf, module: str, vaddrs: list[int], name: str) -> Die | None:
        key = (module, name)
        if key not in self._structs:
            self._structs[key] = None
            for vaddr in vaddrs:
                unit = dwarf.unit_at_address(vaddr)
                found = _defined(dwarf, unit, name) if unit is not None else None
                if found is not None:
                    self._structs[key] = found
                    break
        return self._structs[key]


def _defined(dwarf: Dwarf, unit: Die, name: str) -> Die | None:
    """`struct name` (or a typedef of a struct) defined at the unit's top level."""
    for die in dwarf.children(unit):
        tag = dwarf.tag(die)
        if tag not in (DW_TAG_structure_type, DW_TAG_typedef) or dwarf.name(die) != name:
            continue
        struct = _strip(dwarf, die)
        if struct is not None and dwarf.tag(struct) == DW_TAG_structure_type and \
                not dwarf.has(struct, DW_AT_declaration):
            return struct
    return None


def _strip(dwarf: Dwarf, die: Die | None) -> Die | None:
    """Through typedefs and qualifiers to the type itself."""
    for _ in range(MAX_DEPTH * 2):
        if die is None or dwarf.tag(die) not in (DW_TAG_typedef, DW_TAG_const_type,
                                                 DW_TAG_volatile_type):
            return die
        die = dwarf.ref(die, DW_AT_type)
    return None


def _path(dwarf: Dwarf, struct: Die, offset: int) -> str | None:
    parts: list[str] = []
    die: Die | None = struct
    for _ in range(MAX_DEPTH):
        if die is None or dwarf.tag(die) not in (DW_TAG_structure_type, DW_TAG_union_type):
            break
        found = _member_at(dwarf, die, offset)
        if found is None:
            break
        name, start, member_type = found
        parts.append(f".{name}")
        offset -= start
        die = _strip(dwarf, member_type)
        if die is not None and dwarf.tag(die) == DW_TAG_array_type:
            element = _strip(dwarf, dwarf.ref(die, DW_AT_type))
            size = dwarf.size(element) if element is not None else None
            if not size:
                break
            parts[-1] += f"[{offset // size}]"
            die, offset = element, offset % size
        if not offset and (die is None or dwarf.tag(die) not in (DW_TAG_structure_type,
                                                                 DW_TAG_union_type)):
            break
    return "".join(parts) or None


def _member_at(dwarf: Dwarf, struct: Die, offset: int, depth: int = 0
               ) -> tuple[str, int, Die | None] | None:
    """The named member covering `offset` (of a union, the first)."""
    if depth > MAX_DEPTH:
        return None
    for die in dwarf.children(struct):
        if dwarf.tag(die) != DW_TAG_member:
            continue
        start = dwarf.udata(die, DW_AT_data_member_location) or 0
        member_type = dwarf.ref(die, DW_AT_type)
        size = dwarf.size(member_type) if member_type is not None else None
        if size is not None and start <= offset < start + max(size, 1):
            name = dwarf.name(die)
            if not name:  # an anonymous struct or union: its members are this one's
                inner = _strip(dwarf, member_type)
                found = _member_at(dwarf, inner, offset - start, depth + 1) \
                    if inner is not None else None
                return (found[0], start + found[1], found[2]) if found else None
            return name, start, member_type
    return None

