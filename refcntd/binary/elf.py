"""ELF facts refcntd needs: symbols, segments, build-id, code bytes.

Everything here is read from the file on disk, so it works without root and
after the traced process is gone.
"""

from __future__ import annotations

import os
import re
import struct
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import cast

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, Section, SymbolTableSection

from refcntd.errors import BinaryError, InputFileError, ScriptError
from refcntd.inputs.files import open_regular, read_bytes

# Suffixes gcc gives to compiler-made copies of a function (IPA clones, split parts).
CLONE_RE = re.compile(r"^(?P<base>[^.]+)\.(?P<kind>constprop|isra|part|cold|lto_priv|localalias)"
                      r"(\.\d+)*(\..*)?$")
PT_NOTE = 4  # program header of a note segment
NT_GNU_BUILD_ID = 3  # note type of a GNU build-id
SYM_FORMAT = "<IBBHQQ"  # Elf64_Sym: st_name, st_info, st_other, st_shndx, st_value, st_size
SYM_SIZE = struct.calcsize(SYM_FORMAT)  # 24


@dataclass(frozen=True)
class Symbol:
    name: str
    vaddr: int
    size: int
    table: str  # ".symtab" or ".dynsym"


@dataclass(frozen=True)
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int
    executable: bool


@dataclass(frozen=True)
class SymbolRow:
    """One symbol table entry as the file has it."""

    name: str
    value: int
    info: int  # bind << 4 | type
    other: int  # visibility in the low 2 bits
    shndx: int  # 0: undefined (imported)


class ElfImage:
    """One ELF file opened for analysis; raises BinaryError for anything unusable."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._data = _read_elf_bytes(self.path)
        self._symbol_tables: dict[int, list[SymbolRow]] = {}
        self._relocations: dict[int, list[tuple[int, int, str, int]]] = {}
        try:
            from io import BytesIO
            stream = BytesIO(self._data)
            # pyelftools' ELFFile lives in reference cycles (its structs, sections and
            # stream): only a full collection frees it, and the daemon runs those every
            # ten minutes (service/gcpauses.py).  The stream holds the whole file; closed
            # when this image goes, the bytes go with it.  Each report of a GStreamer
            # process left ~26 such files (~20 MiB) for the next full collection.
            weakref.finalize(self, stream.close)
            self._elf = ELFFile(stream)
            self.segments = self._load_segments()
        except (ELFError, ValueError, IndexError) as err:  # truncated or corrupt headers
            raise BinaryError(f"{self.path}: corrupt ELF file ({err})") from None
        _check_machine(self.path, self._elf)

    @property
    def is_pie_or_shared(self) -> bool:
        return bool(self._elf.header["e_type"] == "ET_DYN")

    @property
    def is_shared_library(self) -> bool:
        return self.is_pie_or_shared and self._elf.get_section_by_name(".interp") is None

    def _load_segments(self) -> list[Segment]:
        segs = []
        for seg in self._elf.iter_segments():
            if seg["p_type"] == "PT_LOAD":
                segs.append(Segment(seg["p_vaddr"], seg["p_offset"], seg["p_filesz"],
                                    seg["p_memsz"], bool(seg["p_flags"] & 1)))
        return segs

    @cached_property
    def sections(self) -> list[Section]:
        """pyelftools' sections, made once: each iter_sections() makes them anew, a GNU
        hash table's included (about 20 ms a pass on libLLVM-14)."""
        return list(self._elf.iter_sections())

    def section_ranges(self, prefix: str) -> list[tuple[int, int]]:
        """[start, end) vaddrs of the sections whose name starts with `prefix`."""
        return [(s["sh_addr"], s["sh_addr"] + s["sh_size"]) for s in self.sections
                if s.name.startswith(prefix)]

    @cached_property
    def build_id(self) -> str | None:
        for section in self.sections:
            if section["sh_type"] != "SHT_NOTE":
                continue
            for note in cast(NoteSection, section).iter_notes():
                # pyelftools names every type-3 note NT_GNU_BUILD_ID, SDT notes too
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    return str(note["n_desc"])
        return None

    @cached_property
    def symbols(self) -> dict[str, list[Symbol]]:
        """Function symbols by name from .symtab and .dynsym (perf's stubs are .symtab only)."""
        found: dict[str, list[Symbol]] = {}
        seen: set[tuple[str, int]] = set()
        for table in (".symtab", ".dynsym"):
            for name, value, size in self._function_symbols(table):
                name = name.split("@", 1)[0]
                if (name, value) in seen:
                    continue
                seen.add((name, value))
                found.setdefault(name, []).append(Symbol(name, value, size, table))
        return found

    def _function_symbols(self, table: str) -> Iterator[tuple[str, int, int]]:
        """(name, value, size) of the defined STT_FUNC entries of `table`.

        Read with struct rather than pyelftools' per-symbol parser, which costs
        ~0.4 ms a symbol: seconds on a binary as big as perf.  STT_GNU_IFUNC
        (10) stays out, as it always did (pyelftools calls it STT_LOOS): its
        address is the resolver's, not the function's."""
        section = self._elf.get_section_by_name(table)
        if not isinstance(section, SymbolTableSection) or section["sh_entsize"] != 24:
            return
        strtab = self._elf.get_section(section["sh_link"]).data()
        for st_name, st_info, _other, shndx, value, size in struct.iter_unpack(
                "<IBBHQQ", section.data()):
            if st_info & 0xF != 2 or shndx == 0 or not st_name:  # STT_FUNC, defined
                continue
            end = strtab.find(b"\0", st_name)
            yield strtab[st_name:end if end >= 0 else None].decode(errors="replace"), value, size

    def relocations(self, section: Section) -> list[tuple[int, int, str, int]]:
        """(r_offset, r_type, symbol name or "", value) of a REL/RELA section, the value
        being the symbol's st_value + the addend (the addend alone without a symbol).

        Read with struct: pyelftools' parser costs ~25 us a relocation, 9 s for
        libLLVM-14's 355 000.  Read once per section: the planner asks per function."""
        key = section["sh_offset"]
        if key not in self._relocations:
            rela = section["sh_type"] == "SHT_RELA"
            layout = struct.Struct("<QQq" if rela else "<QQ")
            symbols = self._symbol_table(section["sh_link"])
            rows = []
            for entry in layout.iter_unpack(section.data()) \
                    if section["sh_entsize"] == layout.size else ():
                sym = symbols[entry[1] >> 32] if 0 < entry[1] >> 32 < len(symbols) else None
                rows.append((entry[0], entry[1] & 0xFFFFFFFF, sym.name if sym else "",
                             (sym.value if sym else 0) + (entry[2] if rela else 0)))
            self._relocations[key] = rows
        return self._relocations[key]

    def dynamic_symbols(self) -> list[SymbolRow]:
        """Every .dynsym entry, defined or not, any type (read with struct: pyelftools'
        parser costs seconds on a library with 100 000 of them)."""
        index = self._elf.get_section_index(".dynsym")
        return self._symbol_table(index) if index is not None else []

    def dynamic_symbols_named(self, name: str) -> list[SymbolRow]:
        """The .dynsym entries called `name` (a version suffix `@...` ignored)."""
        return self._dynamic_by_name.get(name, [])

    @cached_property
    def _dynamic_by_name(self) -> dict[str, list[SymbolRow]]:
        """By name, built once: the planner asks per function and module of a load set."""
        out: dict[str, list[SymbolRow]] = {}
        for row in self.dynamic_symbols():
            out.setdefault(row.name.split("@", 1)[0], []).append(row)
        return out

    def _symbol_table(self, index: int) -> list[SymbolRow]:
        """Every entry of the symbol table at section `index` ([] if it is none)."""
        if index not in self._symbol_tables:
            rows: list[SymbolRow] = []
            section = self._elf.get_section(index) if index else None
            if isinstance(section, SymbolTableSection) and section["sh_entsize"] == SYM_SIZE:
                strtab = self._elf.get_section(section["sh_link"]).data()
                for st_name, info, other, shndx, value, _size in struct.iter_unpack(
                        SYM_FORMAT, section.data()):
                    end = strtab.find(b"\0", st_name)
                    rows.append(SymbolRow(strtab[st_name:end if end >= 0 else None].decode(
                        errors="replace"), value, info, other, shndx))
            self._symbol_tables[index] = rows
        return self._symbol_tables[index]

    @cached_property
    def has_symtab(self) -> bool:
        return self._elf.get_section_by_name(".symtab") is not None

    @cached_property
    def has_debug_info(self) -> bool:
        return self._elf.get_section_by_name(".debug_info") is not None

    def clones_of(self, name: str) -> list[Symbol]:
        """Compiler-made copies (`name.constprop.0`, `name.isra.0`, ...) of a function."""
        return list(self._clones.get(name, ()))

    @cached_property
    def _clones(self) -> dict[str, list[Symbol]]:
        """Clones by the name they copy: one pass over the symbols, not one per question."""
        out: dict[str, list[Symbol]] = {}
        for sym_name, syms in self.symbols.items():
            m = CLONE_RE.match(sym_name)
            if m:
                out.setdefault(m.group("base"), []).extend(syms)
        return out

    def vaddr_to_offset(self, vaddr: int) -> int | None:
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def offset_to_vaddr(self, offset: int) -> int | None:
        for seg in self.segments:
            if seg.offset <= offset < seg.offset + seg.filesz:
                return offset - seg.offset + seg.vaddr
        return None

    def code_at(self, vaddr: int, size: int) -> bytes:
        offset = self.vaddr_to_offset(vaddr)
        if offset is None:
            return b""
        return self._data[offset:offset + size]

    def min_vaddr(self) -> int:
        return min((s.vaddr for s in self.segments), default=0) & ~0xFFF

    def interpreter(self) -> str | None:
        section = self._elf.get_section_by_name(".interp")
        return section.data().rstrip(b"\0").decode() if section is not None else None

    def data_symbol(self, name: str) -> int | None:
        """Address of a data object symbol (e.g. ld.so's _r_debug)."""
        for table in (".dynsym", ".symtab"):
            section = self._elf.get_section_by_name(table)
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.get_symbol_by_name(name) or []:
                if sym["st_info"]["type"] == "STT_OBJECT" and sym["st_shndx"] != "SHN_UNDEF":
                    return int(sym["st_value"])
        return None

    def runpaths(self) -> list[str]:
        """DT_RUNPATH/DT_RPATH entries, for finding libraries the way ld.so does."""
        dynamic = self._elf.get_section_by_name(".dynamic")
        if dynamic is None:
            return []
        out: list[str] = []
        for tag in cast(DynamicSection, dynamic).iter_tags():
            if tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                value: str = getattr(tag, "runpath", "") or getattr(tag, "rpath", "")
                out.extend(p for p in value.split(":") if p)
        return out

    def soname(self) -> str | None:
        """DT_SONAME: the name programs load this library by."""
        dynamic = self._elf.get_section_by_name(".dynamic")
        if dynamic is None:
            return None
        for tag in cast(DynamicSection, dynamic).iter_tags():
            if tag.entry.d_tag == "DT_SONAME":
                return str(getattr(tag, "soname", "")) or None
        return None

    def debug_link(self) -> str | None:
        section = self._elf.get_section_by_name(".gnu_debuglink")
        if section is None:
            return None
        return section.data().split(b"\0", 1)[0].decode(errors="replace")

    def elffile(self) -> ELFFile:
        """The pyelftools object, for DWARF and notes readers."""
        return self._elf


def _read_elf_bytes(path: Path) -> bytes:
    try:
        path.stat()
    except FileNotFoundError:
        raise BinaryError(f"{path}: no such file") from None
    except OSError as err:  # /proc/1/root/... where PID 1 may not be ptraced: EACCES
        raise BinaryError(f"{path}: {err.strerror}") from None
    if path.is_dir():
        raise BinaryError(f"{path}: is a directory, not an ELF binary")
    try:
        data = read_bytes(path, "binary", limit=None)  # a FIFO is refused, not waited on
    except InputFileError as err:
        raise BinaryError(err.message.removeprefix("binary ")) from None
    if data[:4] != b"\x7fELF":
        script = data[:2] == b"#!"
        error = ScriptError if script else BinaryError
        raise error(f"{path}: {'a script' if script else 'not an ELF file'}; give the ELF "
                    "executable or shared library to trace")
    if len(data) < 64:
        raise BinaryError(f"{path}: truncated ELF file ({len(data)} bytes)")
    if data[4] != 2:
        raise BinaryError(f"{path}: 32-bit ELF; refcntd traces x86-64 binaries only")
    return data


def _check_machine(path: Path, elf: ELFFile) -> None:
    if elf.elfclass != 64:
        raise BinaryError(f"{path}: 32-bit ELF; refcntd traces x86-64 binaries only")
    if elf.header["e_machine"] != "EM_X86_64":
        raise BinaryError(f"{path}: ELF for {elf.header['e_machine']}; refcntd traces x86-64 only")
    if elf.header["e_type"] not in ("ET_EXEC", "ET_DYN"):
        raise BinaryError(f"{path}: ELF type {elf.header['e_type']} is not an executable or "
                          "shared library")


def read_build_id(path: str | os.PathLike[str]) -> str | None:
    """GNU build-id from the PT_NOTE segments, reading only the headers and notes.

    Used to index whole library directories, where parsing each file fully
    would be too slow.
    """
    import struct
    try:
        fd = open_regular(path, "library", limit=None)  # a FIFO or device is not waited on
    except InputFileError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, _flags, p_offset, _v, _p, p_filesz = struct.unpack_from(
                    "<IIQQQQ", table, i * phentsize)
                if p_type == PT_NOTE:
                    f.seek(p_offset)
                    found = _build_id_in_notes(f.read(min(p_filesz, 4096)))
                    if found:
                        return found
    except (OSError, struct.error):
        return None
    return None


def _build_id_in_notes(notes: bytes) -> str | None:
    import struct
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
        name_end = pos + 12 + ((namesz + 3) & ~3)
        desc = notes[name_end:name_end + descsz]
        if ntype == NT_GNU_BUILD_ID and notes[pos + 12:pos + 12 + namesz].rstrip(b"\0") == b"GNU":
            return desc.hex()
        pos = name_end + ((descsz + 3) & ~3)
    return None
