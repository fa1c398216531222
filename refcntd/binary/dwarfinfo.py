"""What DWARF says about compiler-made copies of the probed functions.

* A clone (`f.constprop.0`) may drop or reorder arguments; its DWARF
  subprogram names, for each surviving parameter of `f`, the register it
  arrives in.  That is the only safe way to probe a clone.
* An inlined copy has no entry to probe: its calls are invisible to uprobes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from elftools.dwarf.die import DIE

from refcntd.binary.elf import ElfImage

# DWARF x86-64 register numbers of the six integer argument registers.
_DWARF_ARG_REG = {5: 1, 4: 2, 1: 3, 2: 4, 8: 5, 9: 6}  # rdi rsi rdx rcx r8 r9
DW_OP_REG0 = 0x50
WALK_BUDGET_S = 20.0


@dataclass(frozen=True)
class InlinedCopies:
    function: str
    count: int
    sites: tuple[str, ...]  # "file:line" of some call sites


def _dies(image: ElfImage, budget_s: float = WALK_BUDGET_S) -> Iterator[DIE]:
    if not image.has_debug_info:
        return
    deadline = time.monotonic() + budget_s
    dwarf = image.elffile().get_dwarf_info()
    for cu in dwarf.iter_CUs():
        yield from cu.iter_DIEs()
        if time.monotonic() > deadline:
            return


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


def clone_argument_registers(image: ElfImage, clone_vaddr: int, original: str
                             ) -> dict[int, int] | None:
    """{original argument index: argument register index in the clone}, from DWARF.

    None when the DWARF does not describe the clone; arguments that were
    dropped (constant-propagated or unused) are simply absent.
    """
    for die in _dies(image):
        if die.tag != "DW_TAG_subprogram":
            continue
        low = die.attributes.get("DW_AT_low_pc")
        if low is None or low.value != clone_vaddr or _name(die) != original:
            continue
        return _parameter_registers(die)
    return None


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


def inlined_copies(image: ElfImage, names: set[str]) -> list[InlinedCopies]:
    """Inlined instances of `names` (within the walk budget)."""
    found: dict[str, list[str]] = {}
    for die in _dies(image):
        if die.tag != "DW_TAG_inlined_subroutine":
            continue
        name = _name(_origin(die))
        if name in names:
            line = die.attributes.get("DW_AT_call_line")
            found.setdefault(name, []).append(f"line {line.value}" if line else "?")
    return [InlinedCopies(n, len(s), tuple(s[:5])) for n, s in sorted(found.items())]
