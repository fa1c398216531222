"""The libdw DWARF scan finds exactly what walking every DIE finds, and says when it
could not look everywhere.  On the big-binary benchmark's program at smoke size:
inlined copies of obj_get in three compilation units, gcc clones of obj_get/obj_put."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import EXAMPLES, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bigsource  # noqa: E402

from refcntd.binary import abbrev, dwarfinfo  # noqa: E402
from refcntd.binary.elf import ElfImage  # noqa: E402
from refcntd.binary.plan import build_plan  # noqa: E402
from refcntd.cli.check import render_check  # noqa: E402
from refcntd.inputs.spec import load_spec  # noqa: E402

NAMES = {"obj_init", "obj_get", "obj_put", "__refcnt__init", "__refcnt__get",
         "__refcnt__put", "refcnt__delete"}


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> ElfImage:
    return ElfImage(bigsource.build(tmp_path_factory.mktemp("big"), bigsource.SMOKE))


@pytest.fixture(scope="module")
def lto_program(tmp_path_factory: pytest.TempPathFactory) -> ElfImage:
    """The same sources linked with -flto: inlined copies name origins in other units."""
    out = tmp_path_factory.mktemp("lto")
    sources = bigsource.generate(out, bigsource.SMOKE) + [EXAMPLES / "refcnt.c"]
    subprocess.run(["gcc", "-g", "-O2", "-flto", f"-I{EXAMPLES}", f"-I{out}", "-o",
                    str(out / "prog"), *map(str, sources)], check=True)
    return ElfImage(out / "prog")


def test_fast_scan_matches_full_walk(program: ElfImage) -> None:
    fast = dwarfinfo.inlined_copies(program, NAMES)
    full = dwarfinfo.full_walk_inlined(program, NAMES)
    assert fast.method == "libdw" and fast.complete and full.complete
    assert fast.copies == full.copies
    assert [(c.function, c.count) for c in fast.copies] == [("obj_get", 3)]


def _crossing(image: ElfImage) -> set[int]:
    return abbrev.cross_unit_tables(image.elffile().get_section_by_name(".debug_abbrev").data())


def test_fast_scan_matches_full_walk_across_units_with_lto(lto_program: ElfImage,
                                                           program: ElfImage) -> None:
    assert _crossing(lto_program) and not _crossing(program)  # LTO units walked in full
    fast = dwarfinfo.inlined_copies(lto_program, NAMES)
    full = dwarfinfo.full_walk_inlined(lto_program, NAMES)
    assert fast.complete and fast.copies == full.copies
    assert sum(c.count for c in fast.copies) >= 1


def test_clone_registers_match_full_walk(program: ElfImage) -> None:
    clones = program.clones_of("obj_get") + program.clones_of("obj_put")
    assert {c.name for c in clones} == {"obj_get.constprop.0", "obj_put.constprop.0"}
    for clone in clones:
        base = clone.name.split(".")[0]
        fast = dwarfinfo.clone_argument_registers(program, clone.vaddr, base)
        walked = [d for d in dwarfinfo._walk_subprograms_at(program, clone.vaddr)
                  if dwarfinfo._name(d) == base]
        assert fast == dwarfinfo._parameter_registers(walked[0])
        assert fast is not None and fast[1] == 1  # the object stays in rdi


def test_unfinished_scan_is_reported_with_the_units_left(
        lto_program: ElfImage, monkeypatch: pytest.MonkeyPatch) -> None:
    scan = dwarfinfo.inlined_copies(lto_program, NAMES, budget_s=-1)
    assert not scan.complete and scan.not_examined
    monkeypatch.setattr(dwarfinfo, "WALK_BUDGET_S", -1.0)
    plan = build_plan(load_spec("example-objapi"), str(lto_program.path))
    text = render_check(plan)
    assert "INCOMPLETE: " in text and "not examined for inlined copies of obj_get" in text
    assert scan.not_examined[0] in text
