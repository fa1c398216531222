"""Compile a module's CFI into the compact table the BPF unwinder steps with.

Every x86-64 module carries `.eh_frame` (the ABI requires it), often
`.debug_frame` too.  binutils' `readelf --debug-dump=frames-interp` already
evaluates the CFA programs into one row per pc range; this module keeps the
three rules the unwinder needs (CFA = rsp/rbp + offset or the PLT
expression, return address at CFA-8, where rbp was saved), converts pcs to
file offsets (what BPF computes from a mapping) and packs the rows sorted,
as struct cfi_row.  A table is compiled once per machine: it is cached on
disk under CACHE_DIR/cfi by build-id.

Modules come from traced processes and refcntd runs as root: the file is
opened once through inputs/safefs.py (a FIFO or device is refused) and
readelf, found at its absolute path with `--` before the name, reads that
descriptor.  pyelftools cannot replace it here: it fails on libc's CFI
(an opcode it does not know) and is twenty times slower.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from refcntd.errors import BinaryError
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, atomic_write, open_untrusted
from refcntd.kernel.abi import CfaRule
from refcntd.paths import CACHE_DIR, read_cache

if TYPE_CHECKING:  # attach imports this module early (kernel/loader.py): not pyelftools
    from refcntd.binary.elf import ElfImage, Segment

ROW = struct.Struct("<IihBB")  # struct cfi_row
CACHE_VERSION = b"refcntd-cfi-2\n"  # 2: _start kept its end row (see _parse_readelf)
FP_SHARE = 0.7  # FDEs using rbp as CFA base in a frame-pointer build (leaf stubs use rsp)
READELF = "/usr/bin/readelf"  # binutils; never looked up in PATH

# readelf's entry headers: (cie offset, pc start, pc end) and (cie offset); also
# reach/exitframes.py's
FDE_LINE = re.compile(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=([0-9a-f]+) "
                      r"pc=([0-9a-f]+)\.\.([0-9a-f]+)")
CIE_LINE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE")
_LOC = re.compile(r"^[0-9a-f]{8,16} ")
_REG_OFF = re.compile(r"^(rsp|rbp)\+(-?\d+)$")


@dataclass(frozen=True)
class CfiTable:
    build_id: bytes  # 20 bytes, zero-padded
    rows: bytes  # packed struct cfi_row, sorted by pc (a file offset)
    has_frame_pointers: bool
    text_offset: int  # p_offset of the executable segment
    build_seconds: float = 0.0  # 0 when read from the cache

    @property
    def count(self) -> int:
        return len(self.rows) // ROW.size


@dataclass
class _Fde:
    start: int
    end: int
    rows: list[tuple[int, int, int, int]]  # vaddr, CfaRule, cfa offset, rbp offset


def load_table(path: str, cache_dir: Path | None = None) -> CfiTable:
    """The table of `path`, from the cache when it was compiled before."""
    from refcntd.binary.elf import ElfImage
    try:
        module = open_untrusted(path, ELF_LIMIT, what="module", follow_symlinks=True)
    except UntrustedFileError as err:
        raise BinaryError(err.message) from None
    with module:
        image = ElfImage(module.fd_path)
        mtime = os.fstat(module.file.fileno()).st_mtime_ns
        build_id = bytes.fromhex(image.build_id or "")[:20].ljust(20, b"\0")
        key = image.build_id or hashlib.sha1(f"{path}:{mtime}".encode()).hexdigest()
        cache = (cache_dir or CACHE_DIR / "cfi") / f"{key}.cfi"
        cached = _read_cache(cache, build_id)
        if cached is not None:
            return cached
        started = time.monotonic()
        table = compile_table(path, image, build_id, readelf_frames(module.fd_path))
    table = CfiTable(table.build_id, table.rows, table.has_frame_pointers, table.text_offset,
                     time.monotonic() - started)
    _write_cache(cache, table)
    return table


def compile_table(path: str, image: ElfImage, build_id: bytes, frames: list[str]) -> CfiTable:
    """`frames`: readelf's evaluated CFI of the file (`readelf_frames`)."""
    text = [s for s in image.segments if s.executable]
    if not text:
        raise BinaryError(f"{path}: no executable segment")
    fdes = _merge(_parse_readelf(frames, _plt_ranges(image)))
    rows: list[tuple[int, int, int, int]] = []
    for fde in fdes:
        for vaddr, rule, cfa_off, rbp_off in fde.rows:
            _append(rows, (_to_offset(text, vaddr), rule, cfa_off, rbp_off))
        _append(rows, (_to_offset(text, fde.end), CfaRule.NONE, 0, 0), at_end=True)
    rows = [r for r in rows if r[0] >= 0]
    packed = b"".join(ROW.pack(pc, off, rbp, rule, 0) for pc, rule, off, rbp in rows)
    with_rbp = sum(1 for f in fdes if any(r[1] == CfaRule.RBP for r in f.rows))
    has_fp = bool(fdes) and with_rbp / len(fdes) >= FP_SHARE
    return CfiTable(build_id, packed, has_fp, min(s.offset for s in text))


def _append(rows: list[tuple[int, int, int, int]], row: tuple[int, int, int, int],
            at_end: bool = False) -> None:
    """Sorted rows: a row at the pc of the last replaces it; an end marker never
    replaces the next function's first row; repeats of the same rule are dropped."""
    if rows and rows[-1][0] == row[0]:
        if at_end:
            return
        rows.pop()
    if rows and rows[-1][1:] == row[1:]:
        return
    rows.append(row)


def _to_offset(text: list[Segment], vaddr: int) -> int:
    for seg in text:
        if seg.vaddr <= vaddr <= seg.vaddr + seg.memsz:
            return vaddr - seg.vaddr + seg.offset
    return -1


def readelf_frames(fd_path: str, timeout: float = 600) -> list[str]:
    """readelf's evaluated CFI of /proc/self/fd/N (the descriptor is passed on: it reads
    that file); BinaryError if readelf cannot run."""
    fd = int(fd_path.rsplit("/", 1)[1])
    try:
        out = subprocess.run([READELF, "--debug-dump=frames-interp", "--", fd_path],
                             capture_output=True, text=True, timeout=timeout, pass_fds=(fd,),
                             stdin=subprocess.DEVNULL, env={"LC_ALL": "C", "PATH": "/usr/bin"})
    except (OSError, subprocess.SubprocessError) as err:
        raise BinaryError(f"readelf failed ({err})") from None
    return out.stdout.splitlines()


def _plt_ranges(image: ElfImage) -> list[tuple[int, int]]:
    return image.section_ranges(".plt")


def _parse_readelf(lines: list[str], plt: list[tuple[int, int]]) -> list[_Fde]:
    """FDEs with their evaluated rows; an FDE without rows inherits its CIE's."""
    cies: dict[str, list[tuple[int, int, int, int]]] = {}
    fdes: list[_Fde] = []
    columns: list[str] = []
    current: list[tuple[int, int, int, int]] | None = None
    fde: _Fde | None = None
    cie_of_fde = ""
    for line in lines:
        if m := CIE_LINE.match(line):
            current, fde = cies.setdefault(m[1], []), None
        elif m := FDE_LINE.match(line):
            fde = _Fde(int(m[2], 16), int(m[3], 16), [])
            current, cie_of_fde = fde.rows, m[1]
            if fde.start:
                fdes.append(fde)
        elif line.strip().startswith("LOC"):
            columns = line.split()
        elif current is not None and _LOC.match(line) and columns:
            in_plt = fde is not None and any(a <= fde.start < b for a, b in plt)
            current.append(_row(dict(zip(columns, line.split(), strict=False)), in_plt))
        elif not line.strip():  # a blank line ends an entry's table
            if fde is not None and not fde.rows:
                fde.rows.extend((fde.start, *r[1:]) for r in cies.get(cie_of_fde, [])[-1:])
            current = None  # "00000128 ZERO terminator" looks like a row: it is not one
    return fdes


def _row(cols: dict[str, str], in_plt: bool) -> tuple[int, int, int, int]:
    pc = int(cols["LOC"], 16)
    rbp = cols.get("rbp", "u")
    rbp_off = int(rbp[1:]) if rbp.startswith("c") and rbp[1:].lstrip("-").isdigit() else 0
    if cols.get("ra", "u") == "u":
        return pc, CfaRule.END, 0, 0
    cfa = cols.get("CFA", "")
    if m := _REG_OFF.match(cfa):
        return pc, CfaRule.RSP if m[1] == "rsp" else CfaRule.RBP, int(m[2]), rbp_off
    return pc, CfaRule.PLT if cfa == "exp" and in_plt else CfaRule.BAD, 0, 0


def _merge(fdes: list[_Fde]) -> list[_Fde]:
    """Sorted, non-overlapping: .eh_frame first, .debug_frame only where it adds."""
    out: list[_Fde] = []
    for fde in sorted(fdes, key=lambda f: f.start):
        if out and fde.start < out[-1].end:
            continue
        if fde.rows:
            out.append(fde)
    return out


def _read_cache(path: Path, build_id: bytes) -> CfiTable | None:
    data = read_cache(path)
    if data is None:
        return None
    if not data.startswith(CACHE_VERSION) or len(data) < len(CACHE_VERSION) + 28:
        return None
    at = len(CACHE_VERSION)
    if data[at:at + 20] != build_id:
        return None
    has_fp, text_offset = struct.unpack_from("<II", data, at + 20)
    return CfiTable(build_id, data[at + 28:], bool(has_fp), text_offset)


def _write_cache(path: Path, table: CfiTable) -> None:
    """Best effort: an unwritable cache only costs a recompile next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, CACHE_VERSION + table.build_id +
                     struct.pack("<II", int(table.has_frame_pointers), table.text_offset) +
                     table.rows)
    except OSError:
        pass
