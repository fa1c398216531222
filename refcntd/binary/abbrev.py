"""Which abbreviation tables of .debug_abbrev can point outside their unit.

An inlined copy whose DW_AT_abstract_origin uses DW_FORM_ref_addr (LTO) or
an alternate file (dwz), or a unit importing another, may name a function
defined in a different unit: libdw's per-unit search would miss it, so such
units are walked in full.  pyelftools parses an abbreviation table in ~30 ms
(perf has a thousand); this reads the raw section once.
"""

from __future__ import annotations

DW_TAG_partial_unit = 0x3C
DW_TAG_imported_unit = 0x3D
DW_AT_abstract_origin = 0x31
DW_FORM_implicit_const = 0x21
# ref_addr, ref_sig8, ref_sup4, ref_sup8, GNU_ref_alt
CROSS_UNIT_FORMS = {0x10, 0x20, 0x1C, 0x24, 0x1F20}


def uleb128(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned LEB128 at `pos`: (value, position after it)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def cross_unit_tables(data: bytes) -> set[int]:
    """Offsets of the tables in `data` (.debug_abbrev) that can refer across units."""
    found: set[int] = set()
    pos, table = 0, 0
    while pos < len(data):
        code, pos = uleb128(data, pos)
        if code == 0:  # end of a table; the next one starts here
            table = pos
            continue
        tag, pos = uleb128(data, pos)
        pos += 1  # children flag
        if tag in (DW_TAG_partial_unit, DW_TAG_imported_unit):
            found.add(table)
        while True:
            attr, pos = uleb128(data, pos)
            form, pos = uleb128(data, pos)
            if attr == 0 and form == 0:
                break
            if form == DW_FORM_implicit_const:
                _, pos = uleb128(data, pos)  # an SLEB: same length rules
            if attr == DW_AT_abstract_origin and form in CROSS_UNIT_FORMS:
                found.add(table)
    return found
