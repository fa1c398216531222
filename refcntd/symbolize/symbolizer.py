"""Turn kernel stack records into function+offset, module and file:line.

Works after the traced process is gone: frames arrive as (build-id, file
offset) and build-ids are looked up in an index of ELF files on disk.  Raw
addresses (the caller's return address read at the probe, the type-name
pointer) are placed with the load biases that the paired raw-address stack
reveals for every module on it.
"""

from __future__ import annotations

import bisect
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.errors import BinaryError
from refcntd.kernel.records import RawFrame

SYSTEM_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib",
                   "/lib64", "/usr/lib64")


@dataclass(frozen=True)
class Frame:
    """One symbolized frame; `function` is empty when no symbol covers the address."""

    module: str
    vaddr: int  # address inside the module's ELF address space
    function: str = ""
    offset: int = 0
    file: str = ""
    line: int = 0
    raw: str = ""  # how the frame came from the kernel, for frames we could not place

    def key(self) -> tuple[str, str, int]:
        """Identity for grouping and baselines: stable across runs and ASLR."""
        if self.function:
            return (Path(self.module).name, self.function, self.offset)
        return (Path(self.module).name or self.raw, "", self.vaddr)

    def describe(self) -> str:
        where = f"{self.function}+0x{self.offset:x}" if self.function else f"0x{self.vaddr:x}"
        if not self.module:
            return f"?? {self.raw}"
        src = f" {self.file}:{self.line}" if self.file else ""
        return f"{where}{src} ({self.module})"


@dataclass(frozen=True)
class CallSiteFrame:
    """A probed call (or tail jump) instruction and the function it enters."""

    kind: str  # "call" or "jmp"
    callee: int  # vaddr in the same module
    length: int  # of the instruction


@dataclass
class ModuleSymbols:
    path: str
    image: ElfImage
    starts: list[int] = field(default_factory=list)
    names: list[tuple[str, int, int]] = field(default_factory=list)  # name, start, size

    @classmethod
    def load(cls, path: str) -> ModuleSymbols:
        image = ElfImage(path)
        syms = sorted((s.vaddr, s.name, s.size) for group in image.symbols.values()
                      for s in group if s.vaddr)
        mod = cls(path, image)
        mod.starts = [s[0] for s in syms]
        mod.names = [(name, start, size) for start, name, size in syms]
        return mod

    def lookup(self, vaddr: int) -> tuple[str, int]:
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return "", 0
        name, start, size = self.names[i]
        if size and vaddr >= start + size:
            return "", 0
        return name, vaddr - start

    def contains(self, vaddr: int) -> bool:
        return any(s.vaddr <= vaddr < s.vaddr + s.memsz for s in self.image.segments)


class BuildIdIndex:
    """build-id -> path, filled from known modules and, on a miss, nearby directories."""

    def __init__(self) -> None:
        self._by_id: dict[str, str] = {}
        self._by_file: dict[tuple[int, int], str] = {}  # (kernel dev, inode) -> path
        self._scanned: set[str] = set()
        self._dirs: list[str] = []
        self._seen: set[str] = set()

    def add(self, path: str) -> str | None:
        try:
            st = os.stat(path)
            self._by_file.setdefault((os.major(st.st_dev) << 20 | os.minor(st.st_dev),
                                      st.st_ino), str(Path(path).resolve()))
        except OSError:
            pass
        build_id = read_build_id(path)
        if build_id:
            self._by_id.setdefault(build_id, str(Path(path).resolve()))
            self.add_search_dir(str(Path(path).resolve().parent))
        return build_id

    def add_process_maps(self, maps_file: str) -> None:
        """Index every file a live process maps (best effort: it may be gone already)."""
        try:
            lines = open(maps_file).read().splitlines()
        except OSError:
            return
        for fields in (line.split(None, 5) for line in lines):
            if len(fields) == 6:
                self.add_library(fields[5])

    def add_library(self, path: str) -> None:
        """A path the dynamic loader reported; indexed once."""
        if path.startswith("/") and path not in self._seen:
            self._seen.add(path)
            self.add(path)

    def add_search_dir(self, directory: str) -> None:
        if directory not in self._dirs:
            self._dirs.append(directory)

    def find_file(self, file: tuple[int, int]) -> str | None:
        """A file known by (kernel dev, inode): libraries reported by ld.so, probed modules,
        exec'ed programs, else found in the directories searched for build-ids."""
        return self._lookup(self._by_file, file)

    def find(self, build_id: str) -> str | None:
        return self._lookup(self._by_id, build_id)

    def _lookup(self, table: Mapping[Any, str], key: object) -> str | None:
        if key in table:
            return table[key]
        for directory in [*self._dirs, *SYSTEM_LIB_DIRS]:
            if directory not in self._scanned:
                self._scan(directory)
                if key in table:
                    return table[key]
        return None

    def _scan(self, directory: str) -> None:
        self._scanned.add(directory)
        try:
            entries = sorted(Path(directory).iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.is_file() and _looks_like_elf(entry):
                self.add(str(entry))


def _looks_like_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


class Symbolizer:
    """Caches symbol tables and source lines per module across many reports."""

    def __init__(self, index: BuildIdIndex,
                 call_sites: dict[tuple[str, int], CallSiteFrame] | None = None) -> None:
        self.index = index
        self.call_sites = call_sites or {}  # (module, vaddr) of call-site probes
        self._modules: dict[str, ModuleSymbols | None] = {}
        self._lines: dict[tuple[str, int], tuple[str, int]] = {}

    def module(self, path: str) -> ModuleSymbols | None:
        if path not in self._modules:
            try:
                self._modules[path] = ModuleSymbols.load(path)
            except BinaryError:
                self._modules[path] = None
        return self._modules[path]

    def place_frames(self, frames: Iterable[RawFrame]) -> list[tuple[str, int] | None]:
        """(module path, vaddr) per build-id frame; None where it cannot be placed."""
        out: list[tuple[str, int] | None] = []
        for frame in frames:
            path = self.index.find(frame.build_id) if frame.build_id else None
            if frame.file is not None:
                path = self.index.find_file(frame.file)
            mod = self.module(path) if path else None
            vaddr = mod.image.offset_to_vaddr(frame.offset) if mod else None
            if mod and frame.text_relative:
                vaddr = min(s.vaddr for s in mod.image.segments if s.executable) + frame.offset
            out.append((path, vaddr) if path and mod and vaddr is not None else None)
        return out

    def biases(self, placed: list[tuple[str, int] | None], raw_ips: tuple[int, ...]
               ) -> dict[str, int]:
        """Load bias of each module seen on both walks of the same stack."""
        if len(placed) != len(raw_ips):
            return {}
        return {p[0]: ip - p[1] for p, ip in zip(placed, raw_ips, strict=True) if p}

    def place_raw(self, ip: int, biases: dict[str, int]) -> tuple[str, int] | None:
        for path, bias in biases.items():
            mod = self.module(path)
            if mod and mod.contains(ip - bias):
                return path, ip - bias
        return None

    def read_string(self, ptr: int, biases: dict[str, int], limit: int = 64) -> str | None:
        placed = self.place_raw(ptr, biases)
        if placed is None:
            return None
        mod = self.module(placed[0])
        data = mod.image.code_at(placed[1], limit) if mod else b""
        if b"\0" not in data:
            return None
        return data.split(b"\0", 1)[0].decode(errors="replace") or None

    def frame(self, placed: tuple[str, int] | None, raw: str, return_address: bool) -> Frame:
        if placed is None:
            return Frame("", 0, raw=raw)
        path, vaddr = placed
        mod = self.module(path)
        function, offset = mod.lookup(vaddr) if mod else ("", 0)
        file, line = self.source_line(path, vaddr - 1 if return_address else vaddr)
        return Frame(path, vaddr, function, offset, file, line)

    def as_entry_probe(self, first: tuple[str, int] | None, frames: list[Frame]) -> None:
        """Show a call-site probe's stack as an entry probe's: the callee first, then
        the caller at the call's return address.  A tail jump leaves its function off,
        as it is off the stack at the callee's entry."""
        site = self.call_sites.get(first) if first else None
        if site is None or not frames or first is None:
            return
        path, vaddr = first
        callee = self.frame((path, site.callee), "", False)
        if site.kind == "call":
            frames[0] = self.frame((path, vaddr + site.length), "", True)
            frames.insert(0, callee)
        else:
            frames[0] = callee

    def source_line(self, path: str, vaddr: int) -> tuple[str, int]:
        key = (path, vaddr)
        if key not in self._lines:
            self.prefetch_lines(path, [vaddr])
        return self._lines.get(key, ("", 0))

    def prefetch_lines(self, path: str, vaddrs: Iterable[int]) -> None:
        """One addr2line run per module for many addresses (no-op without DWARF)."""
        todo = sorted({v for v in vaddrs if (path, v) not in self._lines})
        mod = self.module(path)
        if not todo or mod is None or not mod.image.has_debug_info:
            self._lines.update({(path, v): ("", 0) for v in todo})
            return
        for vaddr, loc in zip(todo, _addr2line(path, todo), strict=True):
            self._lines[(path, vaddr)] = loc


def _addr2line(path: str, vaddrs: list[int]) -> list[tuple[str, int]]:
    try:
        out = subprocess.run(["addr2line", "-e", path, *[hex(v) for v in vaddrs]],
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    result = []
    for i in range(len(vaddrs)):
        text = out[i] if i < len(out) else "??:0"
        file, _, line = text.partition(" (")[0].rpartition(":")
        ok = file and file != "??" and line.isdigit() and line != "0"
        result.append((file, int(line)) if ok else ("", 0))
    return result
