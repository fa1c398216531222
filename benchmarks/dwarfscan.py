"""The candidate ways to find inlined copies and clones of probed functions.

`python benchmarks/dwarfscan.py CANDIDATE BINARY NAME...` runs one of them in
this fresh process and prints what it found as JSON, so the caller measures
its time and peak RSS alone (benchmarks/bigbinary.py compares them).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elftools.dwarf.compileunit import CompileUnit  # noqa: E402
from elftools.dwarf.die import DIE  # noqa: E402

from refcntd.binary import dwarfinfo  # noqa: E402
from refcntd.binary.elf import ElfImage  # noqa: E402

# Tags whose subtrees can hold inlined copies (the scopes libdw itself descends).
SCOPES = {"DW_TAG_subprogram", "DW_TAG_lexical_block", "DW_TAG_inlined_subroutine",
          "DW_TAG_namespace", "DW_TAG_try_block", "DW_TAG_catch_block",
          "DW_TAG_class_type", "DW_TAG_structure_type", "DW_TAG_entry_point"}


def as_json(scan: dwarfinfo.InlinedScan) -> list[dict[str, object]]:
    return [{"function": c.function, "count": c.count} for c in scan.copies]


def full_walk(image: ElfImage, names: set[str]) -> object:
    return as_json(dwarfinfo.full_walk_inlined(image, names))


def libdw_index(image: ElfImage, names: set[str]) -> object:
    return as_json(dwarfinfo.inlined_copies(image, names, budget_s=float("inf")))


def pyelftools_pruned(image: ElfImage, names: set[str]) -> object:
    """pyelftools, descending only into scopes, skipping other subtrees by DW_AT_sibling."""
    found: list[DIE] = []
    for cu in image.elffile().get_dwarf_info().iter_CUs():
        _visit(cu, cu.get_top_DIE(), found)
    return [{"function": c.function, "count": c.count}
            for c in dwarfinfo._summarise(found, names)]


def _visit(cu: CompileUnit, die: DIE, found: list[DIE]) -> None:
    for child in cu.iter_DIE_children(die):
        if child.tag == "DW_TAG_inlined_subroutine":
            found.append(child)
        if child.tag in SCOPES and child.has_children:
            _visit(cu, child, found)


def drgn_index(image: ElfImage, names: set[str]) -> object:
    """drgn indexes the DWARF in C, but has no API listing inlined instances."""
    try:
        import drgn
    except ImportError:
        return {"not installed": "drgn is not a dependency: .venv/bin/pip install drgn"}
    prog = drgn.Program()
    prog.main_module(str(image.path), create=True).try_file(str(image.path))
    out: dict[str, object] = {}
    for name in sorted(names):
        try:
            address = prog.function(name).address_  # None: only an inlined definition
            out[name] = hex(address) if address is not None else "no address"
        except LookupError:
            out[name] = None
    return {"out_of_line": out, "inlined": "no API to enumerate inlined instances"}


CANDIDATES: dict[str, Callable[[ElfImage, set[str]], object]] = {
    "pyelftools full walk (before)": full_walk,
    "pyelftools pruned by DW_AT_sibling": pyelftools_pruned,
    "libdw via ctypes (chosen)": libdw_index,
    "drgn 0.3 (PyPI)": drgn_index,
}


def main() -> int:
    candidate, binary, *names = sys.argv[1:]
    t0 = time.monotonic()
    found = CANDIDATES[candidate](ElfImage(binary), set(names))
    print(json.dumps({"found": found, "seconds": time.monotonic() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
