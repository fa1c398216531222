"""One module's symbols and line table: from the file itself and its debug file.

A module keeps what its file has (`.symtab`, or only `.dynsym` once
stripped); the separate debug file, when one is found, adds the full
`.symtab` and the DWARF that file:line comes from.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.symbolize.debugfiles import DebugFileFinder


@dataclass
class ModuleSymbols:
    path: str
    image: ElfImage
    debug_path: str | None = None  # separate debug file the symbols/lines also came from
    pending: bool = False  # a debuginfod download was still running when loaded
    starts: list[int] = field(default_factory=list)
    names: list[tuple[str, int, int]] = field(default_factory=list)  # name, start, size

    @classmethod
    def load(cls, path: str, finder: DebugFileFinder | None = None) -> ModuleSymbols:
        image = ElfImage(path)
        mod = cls(path, image)
        images = [image]
        if finder is not None and not (image.has_symtab and image.has_debug_info):
            debug = mod._attach_debug(finder)
            images += [debug] if debug is not None else []
        syms = sorted({(s.vaddr, s.name, s.size) for img in images
                       for group in img.symbols.values() for s in group if s.vaddr})
        mod.starts = [s[0] for s in syms]
        mod.names = [(name, start, size) for start, name, size in syms]
        return mod

    def _attach_debug(self, finder: DebugFileFinder) -> ElfImage | None:
        found, final = finder.find(self.image)
        self.pending = not final
        if found is None:
            return None
        try:
            debug = ElfImage(found)
        except BinaryError:
            return None
        self.debug_path = found
        return debug

    @property
    def lines_path(self) -> str | None:
        """The file addr2line should read, None when no DWARF is known."""
        if self.image.has_debug_info:
            return self.path
        return self.debug_path

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
