"""Find the separate debug file of a stripped module, where distributions keep it.

Debian ships symbols and DWARF apart from the binary (`-dbgsym` packages,
debuginfod).  The same places gdb and perf look, in the same order:

1. `<root>/.build-id/xx/yyyy.debug` for each debug root (default
   /usr/lib/debug; REFCNTD_DEBUG_DIRS, colon-separated, replaces it);
2. `.gnu_debuglink`: next to the file, in its `.debug/` folder, and under
   each debug root followed by the file's directory; the CRC must match;
3. debuginfod servers in DEBUGINFOD_URLS, downloads cached on disk.

A candidate whose build-id differs from the module's is never used: wrong
symbols are worse than none.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.symbolize.debuginfod import DebuginfodClient, Pending

DEFAULT_DEBUG_DIRS = ("/usr/lib/debug",)


def debug_dirs_from_env() -> tuple[str, ...]:
    value = os.environ.get("REFCNTD_DEBUG_DIRS")
    if value is None:
        return DEFAULT_DEBUG_DIRS
    return tuple(d for d in value.split(":") if d)


@dataclass
class DebugFileFinder:
    """Locates and remembers the debug file of each module (None: there is none)."""

    debug_dirs: tuple[str, ...] = field(default_factory=debug_dirs_from_env)
    debuginfod: DebuginfodClient | None = field(default_factory=DebuginfodClient.from_env)
    _found: dict[str, str | None] = field(default_factory=dict)

    def find(self, image: ElfImage) -> tuple[str | None, bool]:
        """(debug file or None, final); not final while a download is still running."""
        key = str(image.path)
        if key not in self._found:
            try:
                self._found[key] = self._search(image)
            except Pending:
                return None, False
        return self._found[key], True

    def running(self, image: ElfImage) -> bool:
        """A download for this module is still under way (asking again would wait)."""
        build_id = image.build_id
        return bool(build_id and self.debuginfod and self.debuginfod.running(build_id))

    def _search(self, image: ElfImage) -> str | None:
        build_id = image.build_id
        if build_id:
            for path in self.build_id_paths(build_id):
                if _matches(path, build_id):
                    return path
        link = image.debug_link()
        if link:
            crc = debug_link_crc(image)
            for path in self.debuglink_paths(image.path, link):
                if _crc_matches(path, crc) and (not build_id or _matches(path, build_id)):
                    return path
        if build_id and self.debuginfod is not None:
            return self.debuginfod.debuginfo(build_id)
        return None

    def build_id_paths(self, build_id: str) -> list[str]:
        if len(build_id) < 4:
            return []
        return [f"{root}/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
                for root in self.debug_dirs]

    def debuglink_paths(self, module: Path, link: str) -> list[str]:
        here = module.resolve().parent
        out = [str(here / link), str(here / ".debug" / link)]
        out += [f"{root}{here}/{link}" for root in self.debug_dirs]
        return [p for p in out if p != str(module.resolve())]


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


def _matches(path: str, build_id: str) -> bool:
    return os.path.isfile(path) and read_build_id(path) == build_id


def _crc_matches(path: str, crc: int | None) -> bool:
    if not os.path.isfile(path):
        return False
    if crc is None:
        return True
    value = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                value = zlib.crc32(chunk, value)
    except OSError:
        return False
    return value == crc
