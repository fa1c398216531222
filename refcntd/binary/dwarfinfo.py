"""What DWARF says about compiler-made copies of the probed functions.

* A clone (`f.constprop.0`) may drop or reorder arguments; its DWARF
  subprogram names, for each surviving parameter of `f`, the register it
  arrives in.  That is the only safe way to probe a clone.
* An inlined copy has no entry to probe: its calls are invisible to uprobes.

Finding them must not walk every DIE in Python (45 s on perf): libdw walks
the units in C (refcntd/binary/libdw.py) and hands back the offsets of the
few DIEs that matter, which pyelftools then reads.  Units whose inlined
copies may refer across units (LTO, dwz) are walked in Python within a
budget; what the budget leaves unexamined is reported, never dropped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from elftools.dwarf.compileunit import CompileUnit
from elftools.dwarf.die import DIE

from refcntd import progress
from refcntd.binary import abbrev, libdw
from refcntd.binary.elf import ElfImage

# DWARF x86-64 register numbers of the six integer argument registers.
_DWARF_ARG_REG = {5: 1, 4: 2, 1: 3, 2: 4, 8: 5, 9: 6}  # rdi rsi rdx rcx r8 r9
DW_OP_REG0 = 0x50
# Seconds for walking, in Python, the units libdw cannot search alone (LTO, dwz);
# REFCNTD_DWARF_BUDGET_S changes it (0: report them all as not examined).
WALK_BUDGET_S = float(os.environ.get("REFCNTD_DWARF_BUDGET_S", "20"))


@dataclass(frozen=True)
class InlinedCopies:
    function: str
    count: int
    sites: tuple[str, ...]  # "file:line" of some call sites


@dataclass(frozen=True)
class InlinedScan:
    """The inlined copies found, and the units the scan could not examine."""

    copies: tuple[InlinedCopies, ...]
    not_examined: tuple[str, ...] = ()  # unit names (DW_AT_name), for the report
    method: str = ""  # "libdw", "pyelftools walk" or "none"

    @property
    def complete(self) -> bool:
        return not self.not_examined


def _origin(die: DIE) -> DIE | None:
    if "DW_AT_abstract_origin" not in die.attributes:
        return None
    return die.get_DIE_from_attribute("DW_AT_abstract_origin")


def _name(die: DIE | None) -> str:
    while die is not None:
        attr = die.attributes.get("DW_AT_name")
        if attr is not None:
            return str(attr.value.decode(errors="replace"))
        die = _origin(die)
    return ""


def _unit_name(cu: CompileUnit) -> str:
    attr = cu.get_top_DIE().attributes.get("DW_AT_name")
    return str(attr.value.decode(errors="replace")) if attr else f"unit at 0x{cu.cu_offset:x}"


# ---- inlined copies --------------------------------------------------------------
def inlined_copies(image: ElfImage, names: set[str], budget_s: float | None = None
                   ) -> InlinedScan:
    """Inlined instances of `names`: libdw's index, else a budgeted full walk."""
    budget_s = WALK_BUDGET_S if budget_s is None else budget_s
    if not image.has_debug_info:
        return InlinedScan((), method="none")
    try:
        dies, gaps = _libdw_inlined(image, names, budget_s)
        method = "libdw"
    except libdw.LibdwUnavailable:
        dies, gaps = _walk_inlined(image, names, image.elffile().get_dwarf_info().iter_CUs(),
                                   budget_s)
        method = "pyelftools walk"
    return InlinedScan(_summarise(dies, names), tuple(gaps), method)


def full_walk_inlined(image: ElfImage, names: set[str]) -> InlinedScan:
    """Every DIE of every unit, in Python: the reference the fast path is tested against."""
    dies, gaps = _walk_inlined(image, names, image.elffile().get_dwarf_info().iter_CUs(),
                               float("inf"))
    return InlinedScan(_summarise(dies, names), tuple(gaps), "pyelftools walk")


def _summarise(dies: list[DIE], names: set[str]) -> tuple[InlinedCopies, ...]:
    found: dict[str, list[str]] = {}
    for die in sorted(dies, key=lambda d: d.offset):
        name = _name(_origin(die))
        if name in names and not self_nested(die):
            line = die.attributes.get("DW_AT_call_line")
            found.setdefault(name, []).append(f"line {line.value}" if line else "?")
    return tuple(InlinedCopies(n, len(s), tuple(s[:5])) for n, s in sorted(found.items()))


# where a DIE says it is called, and where its function is declared
_CALL_AT = ("DW_AT_call_file", "DW_AT_call_line", "DW_AT_call_column")
_DECL_AT = ("DW_AT_decl_file", "DW_AT_decl_line", "DW_AT_decl_column")


def self_nested(die: DIE) -> bool:
    """An inlined copy of a function inside that function's own body, "called" at the
    function's own declaration: gcc 12 at -O2 emits one when it splits a function and
    folds the split part back (no caller inlined it; the caller calls through the PLT).
    A real inlined call sits at a call in some body: another line, or another function
    around it (a recursive call inlined into itself is at the call's line, not here)."""
    origin = _root(die)
    if origin is None or not _at_declaration(die, origin):
        return False
    parent = die.get_parent()
    while parent is not None and parent.tag == "DW_TAG_lexical_block":
        parent = parent.get_parent()
    if parent is None or parent.tag not in ("DW_TAG_subprogram", "DW_TAG_inlined_subroutine"):
        return False
    around = _root(parent) or parent
    return around.offset == origin.offset


def _root(die: DIE) -> DIE | None:
    """The abstract DIE at the end of `die`'s abstract-origin chain (None: it has none)."""
    origin = _origin(die)
    while origin is not None and (further := _origin(origin)) is not None:
        origin = further
    return origin


def _at_declaration(die: DIE, origin: DIE) -> bool:
    """Whether `die`'s call file and line are `origin`'s declaration (and the column,
    where both give one)."""
    call = [die.attributes[a].value if a in die.attributes else None for a in _CALL_AT]
    decl = [origin.attributes[a].value if a in origin.attributes else None for a in _DECL_AT]
    if None in call[:2] or call[:2] != decl[:2]:
        return False
    return call[2] is None or decl[2] is None or call[2] == decl[2]


def _walk_inlined(image: ElfImage, names: set[str], units: Iterator[CompileUnit],
                  budget_s: float) -> tuple[list[DIE], list[str]]:
    """Walk every DIE of `units` in Python; the units left when the budget ends are gaps."""
    deadline = time.monotonic() + budget_s
    dies: list[DIE] = []
    gaps: list[str] = []
    for cu in units:
        if time.monotonic() > deadline:
            gaps.append(_unit_name(cu))
            continue
        dies += [d for d in cu.iter_DIEs() if d.tag == "DW_TAG_inlined_subroutine"]
    return dies, gaps


def _libdw_inlined(image: ElfImage, names: set[str], budget_s: float
                   ) -> tuple[list[DIE], list[str]]:
    dwarf = image.elffile().get_dwarf_info()
    dies: list[DIE] = []
    cross: list[CompileUnit] = []
    section = image.elffile().get_section_by_name(".debug_abbrev")
    crossing = abbrev.cross_unit_tables(section.data()) if section is not None else set()
    with libdw.Dwarf(image.path) as dw:
        units = list(dw.unit_offsets())
        for done, (unit_off, die_off, abbrev_off) in enumerate(units):
            if done % 64 == 0:
                progress.advance(done, len(units))
            if abbrev_off in crossing:
                cross.append(dwarf.get_CU_at(unit_off))
                continue
            unit = dw.die_at(die_off)
            for fn in dw.top_functions(unit) if unit is not None else ():
                if dw.name(fn) in names:
                    cu = dwarf.get_CU_at(unit_off)
                    dies += [cu.get_DIE_from_refaddr(off) for off in dw.inline_instances(fn)]
    walked, gaps = _walk_inlined(image, names, iter(cross), budget_s)
    return dies + walked, gaps


# ---- clones ----------------------------------------------------------------------
def clone_argument_registers(image: ElfImage, clone_vaddr: int, original: str
                             ) -> dict[int, int] | None:
    """{original argument index: argument register index in the clone}, from DWARF.

    None when the DWARF does not describe the clone; arguments that were
    dropped (constant-propagated or unused) are simply absent.
    """
    if not image.has_debug_info:
        return None
    try:
        candidates = _libdw_subprograms_at(image, clone_vaddr)
    except libdw.LibdwUnavailable:
        candidates = _walk_subprograms_at(image, clone_vaddr)
    for die in candidates:
        if _name(die) == original:
            return _parameter_registers(die)
    return None


def _libdw_subprograms_at(image: ElfImage, vaddr: int) -> list[DIE]:
    """The subprograms starting at `vaddr`: in the unit .debug_aranges names, else any."""
    dwarf = image.elffile().get_dwarf_info()
    with libdw.Dwarf(image.path) as dw:
        unit = dw.unit_at_address(vaddr)
        units = [unit] if unit is not None else \
            [u for _, d, _ in dw.unit_offsets() if (u := dw.die_at(d)) is not None]
        offsets = [dw.offset(fn) for u in units for fn in dw.top_functions(u)
                   if dw.low_pc(fn) == vaddr]
    return [dwarf.get_DIE_from_refaddr(off) for off in offsets]


def _walk_subprograms_at(image: ElfImage, vaddr: int) -> list[DIE]:
    out = []
    for cu in image.elffile().get_dwarf_info().iter_CUs():
        for die in cu.iter_DIEs():
            low = die.attributes.get("DW_AT_low_pc") if die.tag == "DW_TAG_subprogram" else None
            if low is not None and low.value == vaddr:
                out.append(die)
    return out


def _parameter_registers(clone: DIE) -> dict[int, int]:
    abstract = _origin(clone)
    if abstract is None:
        return {}
    order = [c.offset for c in abstract.iter_children() if c.tag == "DW_TAG_formal_parameter"]
    out: dict[int, int] = {}
    for param in clone.iter_children():
        if param.tag != "DW_TAG_formal_parameter":
            continue
        origin = _origin(param)
        loc = param.attributes.get("DW_AT_location")
        if origin is None or loc is None or loc.form != "DW_FORM_exprloc":
            continue
        expr = loc.value
        if len(expr) == 1 and expr[0] - DW_OP_REG0 in _DWARF_ARG_REG and origin.offset in order:
            out[order.index(origin.offset) + 1] = _DWARF_ARG_REG[expr[0] - DW_OP_REG0]
    return out
