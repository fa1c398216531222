"""Inlined copies that are not call sites (issue 39, item 5).

Debian's gcc 12 at -O2 puts an inlined_subroutine of a function inside that
function's own DIE, "called" at the function's own declaration: `check` read it
as a caller that inlined the function and refused an ordinary library.  A real
inlined copy at a call site must still be flagged.  Libraries here are built
by Debian's gcc in the test; Debian's own libc is read through libc6-dbg.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, LIBRARY_SPEC, refcntd
from elftools.dwarf.die import DIE

from refcntd.binary import dwarfinfo
from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library

NAMES = {"widget_ref", "widget_unref"}


def build(tmp_path: Path, *flags: str) -> tuple[Path, Path]:
    """(libselfnest.so built -O2 by Debian's gcc with `flags`, its spec)."""
    lib = tmp_path / "libselfnest.so"
    subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", *flags, "-o", str(lib),
                    str(FIXTURES / "selfnest.c")], check=True)
    spec = tmp_path / "widget.yaml"
    spec.write_text(LIBRARY_SPEC.format(library=lib, type="widget", new="widget_new",
                                       ref="widget_ref", unref="widget_unref"))
    return lib, spec


def raw_copies(image: ElfImage) -> list[DIE]:
    """Every inlined_subroutine DIE of NAMES, by a full walk (no filtering)."""
    dwarf = image.elffile().get_dwarf_info()
    return [d for cu in dwarf.iter_CUs() for d in cu.iter_DIEs()
            if d.tag == "DW_TAG_inlined_subroutine"
            and dwarfinfo._name(dwarfinfo._origin(d)) in NAMES]


def plt_calls(lib: Path, caller: str) -> set[str]:
    """The functions `caller` calls through the PLT, from the disassembly."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], check=True,
                         capture_output=True, text=True).stdout
    body = out.split(f"<{caller}>:\n", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"call.*<(\w+)@plt>", body)) | set(re.findall(r"jmp.*<(\w+)@plt>",
                                                                         body))


def marked_line(marker: str) -> int:
    lines = (FIXTURES / "selfnest.c").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"/* {marker} */" in line)


def test_an_o2_library_nobody_inlines_passes_check(tmp_path):
    lib, spec = build(tmp_path)
    image = ElfImage(lib)
    nested = raw_copies(image)
    assert nested, "gcc no longer nests the functions in themselves: the fixture tests nothing"
    assert all(dwarfinfo.self_nested(d) for d in nested)
    assert plt_calls(lib, "wlist_add") >= {"widget_ref"}  # the truth: nobody inlined it
    assert plt_calls(lib, "wlist_clear") >= {"widget_unref"}
    assert dwarfinfo.inlined_copies(image, NAMES).copies == ()
    assert dwarfinfo.full_walk_inlined(image, NAMES).copies == ()
    result = refcntd(["check", "--binary", str(lib), "--spec", str(spec)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PROBLEM" not in result.stdout
    assert "result: every role can be probed" in result.stdout


def test_real_inlined_call_sites_are_still_flagged(tmp_path):
    """-fno-semantic-interposition: gcc inlines each function at its one call site
    (no PLT call left); exactly those are listed, at the callers' lines, and not the
    copies nested in the functions themselves."""
    lib, spec = build(tmp_path, "-fno-semantic-interposition")
    assert "widget_ref" not in plt_calls(lib, "wlist_add")
    assert "widget_unref" not in plt_calls(lib, "wlist_clear")
    ref, unref = marked_line("WIDGET_REF_CALL"), marked_line("WIDGET_UNREF_CALL")
    found = {c.function: (c.count, c.sites) for c in
             dwarfinfo.inlined_copies(ElfImage(lib), NAMES).copies}
    assert found == {"widget_ref": (1, (f"line {ref}",)),
                     "widget_unref": (1, (f"line {unref}",))}
    result = refcntd(["check", "--binary", str(lib), "--spec", str(spec)])
    assert result.returncode == 24, result.stdout
    problems = [line for line in result.stdout.splitlines() if "was inlined at" in line]
    assert problems == [
        f"PROBLEM: get: widget_ref was inlined at 1 call site(s) in {lib} (line {ref}): "
        "those calls cannot be probed and counts would be wrong; mark it "
        "__attribute__((noinline))",
        f"PROBLEM: put: widget_unref was inlined at 1 call site(s) in {lib} (line {unref}): "
        "those calls cannot be probed and counts would be wrong; mark it "
        "__attribute__((noinline))"]


@pytest.fixture(scope="module")
def debian_libc() -> ElfImage:
    """Debian's libc.so.6 debug file (libc6-dbg, installed by scripts/setup.sh)."""
    build_id = ElfImage(resolve_library("libc.so.6", None)).build_id
    assert build_id is not None
    path = Path(f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug")
    if not path.exists():
        pytest.fail(f"no {path}: install libc6-dbg (bash scripts/setup.sh does)")
    return ElfImage(path)


def test_debian_libc_self_nesting_is_not_reported(debian_libc):
    """Debian's own -O2 build: every function nested in itself at its declaration is
    not a call site; copies elsewhere (in other functions, or at a call's line) are."""
    names = set(debian_libc.symbols)
    dies: list[DIE] = []
    summarise = dwarfinfo._summarise

    def keep(found: list[DIE], wanted: set[str]) -> tuple[dwarfinfo.InlinedCopies, ...]:
        dies.extend(found)
        return summarise(found, wanted)
    dwarfinfo._summarise = keep
    try:
        scan = dwarfinfo.inlined_copies(debian_libc, names, budget_s=300)
    finally:
        dwarfinfo._summarise = summarise
    assert scan.complete and scan.method == "libdw"
    by_name: dict[str, list[bool]] = {}
    for die in dies:
        by_name.setdefault(dwarfinfo._name(dwarfinfo._origin(die)), []).append(
            dwarfinfo.self_nested(die))
    reported = {c.function: c.count for c in scan.copies}
    only_self = {n for n, kinds in by_name.items() if all(kinds)}
    assert len(only_self) >= 50, len(only_self)  # Debian's gcc does this everywhere
    assert not only_self & set(reported)
    real = {n: kinds.count(False) for n, kinds in by_name.items() if not all(kinds)}
    assert len(real) >= 100 and reported == real
