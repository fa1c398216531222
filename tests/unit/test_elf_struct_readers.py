"""ElfImage's struct readers (relocations, .dynsym) against pyelftools' own parser, on
Debian's libcrypto and Python interpreter as installed: every row the same."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from refcntd.binary.callsites import dynamic_export, imports
from refcntd.binary.elf import ElfImage

# Debian's interpreter, whichever release: python3.11 on 12, python3.13 on 13
BINARIES = ["/usr/lib/x86_64-linux-gnu/libcrypto.so.3", os.path.realpath("/usr/bin/python3")]


@pytest.mark.parametrize("path", BINARIES)
def test_relocations_match_pyelftools(path: str) -> None:
    image = ElfImage(Path(path))
    checked = 0
    for section in image.elffile().iter_sections():
        if not isinstance(section, RelocationSection):
            continue
        symtab = image.elffile().get_section(section["sh_link"])
        assert isinstance(symtab, SymbolTableSection)
        expected = []
        for rel in section.iter_relocations():
            addend = rel["r_addend"] if rel.is_RELA() else 0
            sym = symtab.get_symbol(rel["r_info_sym"]) if rel["r_info_sym"] else None
            expected.append((rel["r_offset"], rel["r_info_type"], sym.name if sym else "",
                             (sym["st_value"] if sym else 0) + addend))
        assert image.relocations(section) == expected, section.name
        checked += len(expected)
    assert checked > 500  # a real amount of relocations, named and relative


@pytest.mark.parametrize("path", BINARIES)
def test_dynamic_symbols_match_pyelftools(path: str) -> None:
    image = ElfImage(Path(path))
    dynsym = image.elffile().get_section_by_name(".dynsym")
    assert isinstance(dynsym, SymbolTableSection)
    rows = image.dynamic_symbols()
    reference = list(dynsym.iter_symbols())
    assert len(rows) == len(reference) > 100
    for row, sym in zip(rows, reference, strict=True):
        assert (row.name, row.value) == (sym.name, sym["st_value"])
        assert (row.shndx == 0) == (sym["st_shndx"] == "SHN_UNDEF")
        assert (row.info >> 4 == 0) == (sym["st_info"]["bind"] == "STB_LOCAL")
        assert (row.other & 3 in (0, 3)) == (
            sym["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED"))
    exported = {s.name for s in reference if s["st_shndx"] != "SHN_UNDEF"}
    undefined = {s.name for s in reference if s["st_shndx"] == "SHN_UNDEF"}
    for name in sorted(exported)[::97] + sorted(undefined)[::7]:
        assert dynamic_export(image, name) == (name in exported and any(
            s.name == name and s["st_info"]["bind"] != "STB_LOCAL" and
            s["st_other"]["visibility"] in ("STV_DEFAULT", "STV_PROTECTED")
            for s in reference if s["st_shndx"] != "SHN_UNDEF")), name
        assert imports(image, name) == (name in undefined), name
