"""file:line of addresses from a module's DWARF line table, read in Python.

This replaces binutils' addr2line: refcntd runs as root, and the DWARF comes
from files traced processes chose (their libraries, debug files next to
them), so no external parser runs on it.  pyelftools decodes only the line
program of the compile unit an address falls in (.debug_aranges says which;
without it the units' address ranges are read once), and each decoded unit
is kept.  A malformed table gives no line, never an error.

The line table names the innermost source line: inside code inlined from a
header's `static inline` wrapper that is the wrapper's line.  A frame is
named by its symbol, the outer function, so where a report says "in this
function at this line" (a culprit), `outer_line` gives the line of the call
in that function that the inlined code came from (DW_AT_call_file/line).
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass, field

from elftools.common.exceptions import DWARFError, ELFError, ELFParseError
from elftools.dwarf.compileunit import CompileUnit
from elftools.dwarf.die import DIE
from elftools.dwarf.dwarfinfo import DWARFInfo
from elftools.dwarf.lineprogram import LineProgram
from elftools.dwarf.ranges import BaseAddressEntry, RangeEntry
from elftools.elf.elffile import ELFFile

# what pyelftools raises on a corrupt or truncated table
_CORRUPT = (DWARFError, ELFError, ELFParseError, ValueError, KeyError, IndexError,
            TypeError, AttributeError, AssertionError, struct.error, RecursionError)
Location = tuple[str, int]  # ("", 0): unknown


@dataclass
class _Unit:
    starts: list[int] = field(default_factory=list)  # row addresses, sorted
    rows: list[tuple[int, str, int]] = field(default_factory=list)  # end of sequence, file, line
    names: dict[int, str] = field(default_factory=dict)  # file index -> path


@dataclass
class LineTable:
    """Lines of one ELF file's DWARF; built on the first question."""

    elf: ELFFile
    _dwarf: DWARFInfo | None = None
    _ranges: list[tuple[int, int, int]] | None = None  # low, high, unit offset
    _units: dict[int, _Unit] = field(default_factory=dict)
    _chains: dict[int, tuple[list[InlinedCall], dict[int, str]]] = field(default_factory=dict)
    # unit offset -> its functions with one address range (low, high, DIE), by low
    _functions: dict[int, tuple[list[int], list[tuple[int, int, DIE]]]] = field(
        default_factory=dict)

    def lookup(self, vaddr: int) -> Location:
        try:
            offset = self._unit_offset(vaddr)
            unit = self._unit(offset) if offset is not None else None
        except _CORRUPT:
            return "", 0
        if unit is None:
            return "", 0
        i = bisect.bisect_right(unit.starts, vaddr) - 1
        if i < 0 or unit.rows[i][0]:
            return "", 0  # before the unit's code, or past a sequence's end
        _, file, line = unit.rows[i]
        return (file, line) if file and line else ("", 0)

    def outer_line(self, vaddr: int) -> Location:
        """The line in the function holding `vaddr` as a symbol: where its code was
        inlined, the line of the outermost inlined call; else lookup()."""
        chain, names = self._inline_chain(vaddr)
        site = chain[0][1] if chain else None
        if site is None or not names.get(site[0]):
            return self.lookup(vaddr)
        return names[site[0]], site[1]

    def inlined(self, vaddr: int) -> list[tuple[str, Location]]:
        """The functions inlined at `vaddr`, outermost first, each with the line of
        its call in the function around it; [] when none (or no DWARF)."""
        chain, names = self._inline_chain(vaddr)
        return [(name, (names[site[0]], site[1]) if site and names.get(site[0]) else ("", 0))
                for name, site in chain]

    def _inline_chain(self, vaddr: int) -> tuple[list[InlinedCall], dict[int, str]]:
        """The inlined calls covering `vaddr` and its unit's file names, read once per
        address (every operation path of a report asks for the same few)."""
        if vaddr not in self._chains:
            try:
                offset = self._unit_offset(vaddr)
                unit = self._unit(offset) if offset is not None else None
                cu = self._info().get_CU_at(offset) if offset is not None else None
                scope = self._function_at(offset, cu, vaddr) \
                    if cu is not None and offset is not None else None
                chain = _inline_chain(scope, vaddr) if scope is not None else []
            except _CORRUPT:
                unit, chain = None, []
            self._chains[vaddr] = (chain, unit.names if unit is not None else {})
        return self._chains[vaddr]

    def _function_at(self, offset: int, cu: CompileUnit, vaddr: int) -> DIE:
        """The unit's function DIE whose low_pc/high_pc holds `vaddr`, found by bisection
        (a unit of perf has thousands: walking them all per address took seconds for
        one culprit's code); the unit's top DIE when no such function does."""
        if offset not in self._functions:
            spans = []
            for die in cu.get_top_DIE().iter_children():
                low, high = die.attributes.get("DW_AT_low_pc"), die.attributes.get("DW_AT_high_pc")
                if die.tag == "DW_TAG_subprogram" and low is not None and high is not None:
                    end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
                    spans.append((int(low.value), int(end), die))
            spans.sort(key=lambda t: (t[0], t[1]))
            self._functions[offset] = ([lo for lo, _, _ in spans], spans)
        lows, spans = self._functions[offset]
        i = bisect.bisect_right(lows, vaddr) - 1
        if i >= 0 and vaddr < spans[i][1]:
            return spans[i][2]
        return cu.get_top_DIE()

    def _info(self) -> DWARFInfo:
        if self._dwarf is None:
            self._dwarf = self.elf.get_dwarf_info(relocate_dwarf_sections=False)
        return self._dwarf

    def _unit_offset(self, vaddr: int) -> int | None:
        if self._ranges is None:
            self._ranges = _unit_ranges(self._info())
        i = bisect.bisect_right(self._ranges, (vaddr, 1 << 64)) - 1
        if i >= 0 and vaddr < self._ranges[i][1]:
            return self._ranges[i][2]
        return None

    def _unit(self, offset: int) -> _Unit | None:
        if offset not in self._units:
            unit = self._info().get_CU_at(offset)
            program = self._info().line_program_for_CU(unit)
            self._units[offset] = _decode(program, _comp_dir(unit)) if program else _Unit()
        return self._units[offset]


def _unit_ranges(dwarf: DWARFInfo) -> list[tuple[int, int, int]]:
    """(low, high, unit offset), sorted: from .debug_aranges, else from each unit's
    low_pc/high_pc."""
    aranges = dwarf.get_aranges()
    if aranges is not None:
        return sorted((e.begin_addr, e.begin_addr + e.length, e.info_offset)
                      for e in aranges.entries)
    out = []
    for unit in dwarf.iter_CUs():
        top = unit.get_top_DIE()
        low, high = top.attributes.get("DW_AT_low_pc"), top.attributes.get("DW_AT_high_pc")
        if low is None or high is None:
            continue
        end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
        out.append((int(low.value), int(end), int(unit.cu_offset)))
    return sorted(out)


_SCOPES = frozenset({"DW_TAG_subprogram", "DW_TAG_lexical_block", "DW_TAG_inlined_subroutine"})


# an inlined subroutine: its function's name, and (call file index, call line), None
# when DWARF does not say where it was called
InlinedCall = tuple[str, tuple[int, int] | None]


def _inline_chain(die: DIE, vaddr: int) -> list[InlinedCall]:
    """Every inlined subroutine covering `vaddr` below `die`, outermost first; []
    when the address is in no inlined code."""
    for child in die.iter_children():
        if child.tag == "DW_TAG_namespace":
            found = _inline_chain(child, vaddr)
        elif child.tag in _SCOPES and _covers(child, vaddr):
            found = _inline_chain(child, vaddr)
            if child.tag == "DW_TAG_inlined_subroutine":
                file, line = child.attributes.get("DW_AT_call_file"), \
                    child.attributes.get("DW_AT_call_line")
                site = (int(file.value), int(line.value)) if file and line else None
                return [(_origin_name(child), site), *found]
        else:
            continue
        if found:
            return found
    return []


def _origin_name(die: DIE) -> str:
    """An inlined subroutine's function name, through its abstract origin."""
    for _ in range(4):  # origin -> specification chains are short
        name = die.attributes.get("DW_AT_name")
        if name is not None:
            return _text(name.value)
        for attr in ("DW_AT_abstract_origin", "DW_AT_specification"):
            if attr in die.attributes:
                die = die.get_DIE_from_attribute(attr)
                break
        else:
            return ""
    return ""


def _covers(die: DIE, vaddr: int) -> bool:
    """Whether the DIE's code (low_pc/high_pc, or DW_AT_ranges) holds `vaddr`."""
    attrs = die.attributes
    low, high = attrs.get("DW_AT_low_pc"), attrs.get("DW_AT_high_pc")
    if low is not None and high is not None:
        end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
        return bool(low.value <= vaddr < end)
    ranges = attrs.get("DW_AT_ranges")
    lists = die.dwarfinfo.range_lists() if ranges is not None else None
    cu = die.cu
    if ranges is None or lists is None or not isinstance(cu, CompileUnit):
        return False
    top = cu.get_top_DIE().attributes.get("DW_AT_low_pc")
    base = int(top.value) if top is not None else 0
    for entry in lists.get_range_list_at_offset(ranges.value, cu=cu):
        if isinstance(entry, BaseAddressEntry):
            base = entry.base_address
        elif isinstance(entry, RangeEntry):
            shift = 0 if entry.is_absolute else base
            if entry.begin_offset + shift <= vaddr < entry.end_offset + shift:
                return True
    return False


def _comp_dir(unit: CompileUnit) -> str:
    attr = unit.get_top_DIE().attributes.get("DW_AT_comp_dir")
    return _text(attr.value) if attr is not None else ""


def _decode(program: LineProgram, comp_dir: str) -> _Unit:
    """Every row of the unit's line program, sorted by address."""
    names = _file_names(program, comp_dir)
    rows: list[tuple[int, bool, str, int]] = []
    for entry in program.get_entries():
        state = entry.state
        if state is not None:
            rows.append((state.address, state.end_sequence, names.get(state.file, ""),
                         state.line))
    rows.sort(key=lambda r: (r[0], not r[1]))  # an end and a start at one address: the start
    unit = _Unit(names=names)
    for address, end, file, line in rows:
        unit.starts.append(address)
        unit.rows.append((end, file, line))
    return unit


def _file_names(program: LineProgram, comp_dir: str) -> dict[int, str]:
    """File index -> path, joined with its directory and the unit's as addr2line does
    (DWARF 5 counts files and directories from 0, earlier versions from 1)."""
    header = program.header
    base = 0 if header["version"] >= 5 else 1
    dirs = [comp_dir] * base + [_text(d) for d in header["include_directory"]]
    out = {}
    for i, entry in enumerate(header["file_entry"], start=base):
        directory = dirs[entry.dir_index] if entry.dir_index < len(dirs) else ""
        out[i] = os.path.join(comp_dir, directory, _text(entry.name))
    return out


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
