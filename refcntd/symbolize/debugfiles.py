"""Find the separate debug file of a stripped module, where distributions keep it.

Debian ships symbols and DWARF apart from the binary (`-dbgsym` packages,
debuginfod).  The same places gdb looks, in the same order:

1. `<root>/.build-id/xx/yyyy.debug` for each debug root (default
   /usr/lib/debug; REFCNTD_DEBUG_DIRS, colon-separated, replaces it);
2. `.gnu_debuglink`: next to the file, in its `.debug/` folder, and under
   each debug root followed by the file's directory; the CRC must match;
3. debuginfod servers in DEBUGINFOD_URLS, downloads cached on disk.

A candidate whose build-id differs from the module's is never used: wrong
symbols are worse than none.

The module and its .gnu_debuglink come from traced processes, and refcntd
reads as root.  So the link is taken only as a file name (gdb's rule: an
absolute or `../` name is ignored, with a note), a link without its CRC is
ignored, and the file is opened through inputs/safefs.py: next to the
module (a directory its owner controls) no symbolic link is followed, and a
debug root is used only if trusted_dir accepts it (only root can change
it).  The checks run on the file that is loaded, not on its name.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.inputs import rootpaths
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, open_untrusted, trusted_dir
from refcntd.symbolize.debuginfod import DebuginfodClient, Pending
from refcntd.text import visible

DEFAULT_DEBUG_DIRS = ("/usr/lib/debug",)
MAX_NOTES = 32


def debug_dirs_from_env() -> tuple[str, ...]:
    value = os.environ.get("REFCNTD_DEBUG_DIRS")
    if value is None:
        return DEFAULT_DEBUG_DIRS
    return tuple(d for d in value.split(":") if d)


@dataclass(frozen=True)
class Candidate:
    """A place a debug file may be, and how it must be opened and checked."""

    path: str
    follow_symlinks: bool  # only inside a trusted debug root
    crc: int | None = None  # a .gnu_debuglink candidate's CRC32


@dataclass
class DebugFileFinder:
    """Locates and remembers the debug file of each module (None: there is none)."""

    debug_dirs: tuple[str, ...] = field(default_factory=debug_dirs_from_env)
    debuginfod: DebuginfodClient | None = field(default_factory=DebuginfodClient.from_env)
    notes: list[str] = field(default_factory=list)  # refusals, once each, for the run's notes
    _found: dict[str, Candidate | None] = field(default_factory=dict)
    _roots: tuple[str, ...] | None = None

    def find(self, image: ElfImage) -> tuple[str | None, bool]:
        """(debug file or None, final); not final while a download is still running."""
        debug, final = self.find_image(image)
        return (str(debug.path) if debug else None), final

    def find_image(self, image: ElfImage) -> tuple[ElfImage | None, bool]:
        """The debug file loaded and checked against `image`, and whether that is final."""
        key = str(image.path)
        if key in self._found:
            known = self._found[key]
            return (self._verified(image, known) if known else None), True
        try:
            found = self._search(image)
        except Pending:
            return None, False
        self._found[key] = found[0] if found else None
        return (found[1] if found else None), True

    def all_notes(self) -> list[str]:
        """Refusals of this finder and of its debuginfod client."""
        return [*self.notes, *(self.debuginfod.notes if self.debuginfod else [])]

    def running(self, image: ElfImage) -> bool:
        """A download for this module is still under way (asking again would wait)."""
        build_id = image.build_id
        return bool(build_id and self.debuginfod and self.debuginfod.running(build_id))

    def _search(self, image: ElfImage) -> tuple[Candidate, ElfImage] | None:
        for candidate in self._candidates(image):
            debug = self._verified(image, candidate)
            if debug is not None:
                return candidate, debug
        build_id = image.build_id
        path = self.debuginfod.debuginfo(build_id) if build_id and self.debuginfod else None
        if path is None:
            return None
        downloaded = Candidate(path, follow_symlinks=False)
        debug = self._verified(image, downloaded)
        return (downloaded, debug) if debug else None

    def _candidates(self, image: ElfImage) -> list[Candidate]:
        build_id = image.build_id
        out = [Candidate(p, True) for p in self.build_id_paths(build_id)] if build_id else []
        link = self._link_name(image)
        crc = debug_link_crc(image) if link else None
        if link and crc is None:
            self._note(f"{image.path}: .gnu_debuglink without its CRC: ignored")
        elif link:
            out += [Candidate(p, follow, crc) for p, follow in self.debuglink_paths(image.path,
                                                                                      link)]
        return out

    def build_id_paths(self, build_id: str) -> list[str]:
        if len(build_id) < 4:
            return []
        return [f"{root}/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
                for root in self.trusted_roots()]

    def debuglink_paths(self, module: Path, link: str) -> list[tuple[str, bool]]:
        """(path, may follow links): beside the module, then under each trusted root."""
        here = Path(rootpaths.resolve(module)).parent
        out = [(str(here / link), False), (str(here / ".debug" / link), False)]
        out += [(f"{root}{here}/{link}", True) for root in self.trusted_roots()]
        return [(p, follow) for p, follow in out if p != rootpaths.resolve(module)]

    def trusted_roots(self) -> tuple[str, ...]:
        """The debug roots only root can change; the others once in the notes."""
        if self._roots is None:
            roots = [d for d in self.debug_dirs if os.path.isdir(d)]
            problems = {d: trusted_dir(d) for d in roots}
            for d, problem in problems.items():
                if problem:
                    self._note(f"debug directory {d} not used: {problem}")
            self._roots = tuple(d for d in roots if not problems[d])
        return self._roots

    def _link_name(self, image: ElfImage) -> str | None:
        """The .gnu_debuglink name if it is a plain file name (gdb's rule)."""
        link = image.debug_link()
        if link and (link in (".", "..") or "/" in link):
            self._note(f"{image.path}: .gnu_debuglink names a path ({visible(link)}), not a "
                       "file name: ignored")
            return None
        return link or None

    def _verified(self, image: ElfImage, candidate: Candidate) -> ElfImage | None:
        """The candidate loaded, if it is a regular file and its CRC and build-id match."""
        try:
            with open_untrusted(candidate.path, ELF_LIMIT, what="debug file",
                                follow_symlinks=candidate.follow_symlinks) as f:
                if candidate.crc is not None and _crc32(f.file) != candidate.crc:
                    return None
                debug = ElfImage(f.fd_path)
        except UntrustedFileError as err:
            if not err.missing:
                self._note(f"{err.message}: not used")
            return None
        except (BinaryError, OSError):
            return None
        if image.build_id and debug.build_id != image.build_id:
            return None
        debug.path = Path(candidate.path)
        return debug

    def _note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < MAX_NOTES:
            self.notes.append(text)


def debug_link_crc(image: ElfImage) -> int | None:
    """The CRC32 after the name in .gnu_debuglink (name, NUL, padding to 4, CRC)."""
    section = image.elffile().get_section_by_name(".gnu_debuglink")
    if section is None:
        return None
    data = section.data()
    end = (data.find(b"\0") + 4) & ~3
    if end < 4 or len(data) < end + 4:
        return None
    return int.from_bytes(data[end:end + 4], "little")


def _crc32(f: BinaryIO) -> int:
    value = 0
    while chunk := f.read(1 << 20):
        value = zlib.crc32(chunk, value)
    f.seek(0)
    return value
