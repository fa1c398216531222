"""One module's symbols and line table: from the file itself and its debug file.

A module keeps what its file has (`.symtab`, or only `.dynsym` once
stripped); the separate debug file, when one is found, adds the full
`.symtab` and the DWARF that file:line comes from (lines.py).  Module paths
come from traced processes (their maps, their dynamic loader's list), so the
file is opened through inputs/safefs.py: a FIFO or a device put there is
refused, and the file read is the one checked.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, open_untrusted
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.lines import LineTable, Location


def open_image(path: str) -> ElfImage:
    """The ELF file at `path` (links followed: ld.so's names are links), read once from
    the inode checked; BinaryError when refused or not ELF."""
    try:
        with open_untrusted(path, ELF_LIMIT, what="module", follow_symlinks=True) as f:
            image = ElfImage(f.fd_path)
    except UntrustedFileError as err:
        raise BinaryError(err.message) from None
    image.path = Path(path)  # the name it is known by, not the descriptor it was read from
    return image


@dataclass
class ModuleSymbols:
    path: str
    image: ElfImage
    debug: ElfImage | None = None  # separate debug file the symbols/lines also came from
    pending: bool = False  # a debuginfod download was still running when loaded
    starts: list[int] = field(default_factory=list)
    names: list[tuple[str, int, int]] = field(default_factory=list)  # name, start, size
    _lines: LineTable | None = None

    @classmethod
    def load(cls, path: str, finder: DebugFileFinder | None = None) -> ModuleSymbols:
        image = open_image(path)
        mod = cls(path, image)
        if finder is not None and mod.wants_debug:
            mod.debug, final = finder.find_image(image)
            mod.pending = not final
        images = [image, *([mod.debug] if mod.debug else [])]
        exported = _exported_names(image)
        syms = sorted({(s.vaddr, not _prefixed_alias(s.name, exported.get(s.vaddr, set())),
                        s.name, s.size) for img in images for group in img.symbols.values()
                       for s in group if s.vaddr})
        mod.starts = [s[0] for s in syms]
        mod.names = [(name, start, size) for start, _, name, size in syms]
        return mod

    @property
    def wants_debug(self) -> bool:
        """Its file lacks the full symbol table or DWARF: a debug file would add them."""
        return not (self.image.has_symtab and self.image.has_debug_info)

    @property
    def debug_path(self) -> str | None:
        return str(self.debug.path) if self.debug else None

    @property
    def lines_image(self) -> ElfImage | None:
        """The file whose DWARF gives lines, None when no DWARF is known."""
        if self.image.has_debug_info:
            return self.image
        return self.debug if self.debug and self.debug.has_debug_info else None

    @property
    def lines_path(self) -> str | None:
        image = self.lines_image
        return self.path if image is self.image else self.debug_path if image else None

    def line(self, vaddr: int) -> Location:
        table = self._table()
        return table.lookup(vaddr) if table is not None else ("", 0)

    def outer_line(self, vaddr: int) -> Location:
        """The line in the function `vaddr`'s symbol names (lines.py), past inlined code."""
        table = self._table()
        return table.outer_line(vaddr) if table is not None else ("", 0)

    def inlined(self, vaddr: int) -> list[tuple[str, Location]]:
        """The functions inlined at `vaddr` (lines.py), outermost first."""
        table = self._table()
        return table.inlined(vaddr) if table is not None else []

    def _table(self) -> LineTable | None:
        image = self.lines_image
        if image is None:
            return None
        if self._lines is None:
            self._lines = LineTable(image.elffile())
        return self._lines

    def lookup(self, vaddr: int) -> tuple[str, int]:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        while i >= 0:
            name, start, size = self.names[i]
            if not size or vaddr < start + size:
                return name, vaddr - start
            if i == 0 or self.starts[i - 1] != start:
                break
            i -= 1  # an alias at the same start may be the sized one
        return "", 0

    def contains(self, vaddr: int) -> bool:
        return any(s.vaddr <= vaddr < s.vaddr + s.memsz for s in self.image.segments)


def _exported_names(image: ElfImage) -> dict[int, set[str]]:
    """The names the file exports (.dynsym, defined), by address."""
    exported: dict[int, set[str]] = {}
    for row in image.dynamic_symbols():
        if row.shndx:
            exported.setdefault(row.value, set()).add(row.name.split("@", 1)[0])
    return exported


def _prefixed_alias(name: str, exported: set[str]) -> bool:
    """Whether `name`, not exported itself, is one of the `exported` names at its
    address with a prefix added, which a frame is not named by.

    fontconfig's internal calls go to a hidden `IA__FcPatternDestroy`, the users' to
    the exported FcPatternDestroy at the same address, and a spec names the latter:
    named IA__, the probed function would stay on every operation's path.  Only such
    prefixed copies give way: other aliases keep the name gdb and the DWARF show
    (libc's `__libc_start_main_impl`, not its exported `__libc_start_main`).
    """
    return name not in exported and any(name.endswith(e) for e in exported)
