"""ElfImage.relocations (read with struct) against pyelftools' own parser, on Debian's
libcrypto and python3.11 as installed: every row the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from refcntd.binary.elf import ElfImage


@pytest.mark.parametrize("path", ["/usr/lib/x86_64-linux-gnu/libcrypto.so.3",
                                  "/usr/bin/python3.11"])
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
