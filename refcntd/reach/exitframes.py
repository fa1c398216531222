"""The stack of the thread held at `_exit`, as valgrind's final leak check sees it.

memcheck scans only the words it knows to be defined: when a stack grows, the new
part is undefined until the program writes it.  The frames of libc's exit path
(`exit`, `__run_exit_handlers`, `_exit`) sit where main's frames and the atexit
handlers' were, and their unwritten slots (padding, spill slots of paths not taken)
still hold those frames' pointers: gdb showed `gio list`'s GFile, held only by a
lost enumerator, in two such words of `__run_exit_handlers`' frame, which made it
still reachable here and indirectly lost for valgrind.  A word can't be told defined
from outside, but these frames are libc's own: what they hold of the program is the
callee-saved registers of `exit`'s caller, saved by the CFI's rules.  So the
exit path is scanned for those saved registers only, and the stack above it (the
frame that called `exit`, and its callers) as before.  Found by unwinding with the
`.eh_frame` rows `readelf --debug-dump=frames-interp` evaluates (stack-pointer rules
only, as Debian's libc has); anything else (no `exit` among the first frames: the
program called `_exit` itself) leaves the stack whole; when the unwind leaves libc
without meeting `exit`, no atexit handler ran and the scan says so (such a process is
reported, not judged, as LeakSanitizer, outputs/policy.py).  LeakSanitizer, which checks
from an atexit handler, would scan those stale words too: refcntd follows valgrind.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from refcntd.binary.elf import ElfImage, read_build_id
from refcntd.errors import BinaryError
from refcntd.inputs import rootpaths
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, atomic_write, open_untrusted
from refcntd.kernel.cfi import CIE_LINE, FDE_LINE, readelf_frames
from refcntd.paths import CACHE_DIR, read_cache_json
from refcntd.reach.memory import Mapping, ProcessMemory

EXIT_PATH_FRAMES = 4  # _exit, __run_exit_handlers, exit (and one spare)
SAVED = ("rbx", "rbp", "r12", "r13", "r14", "r15")  # callee-saved on x86-64
_ROW = re.compile(r"^([0-9a-f]{8,16}) +(\S+)")
_RSP = re.compile(r"^rsp\+(\d+)$")
_CACHE_VERSION = 2  # 1: the last FDE had the terminator line as a row


@dataclass(frozen=True)
class Row:
    pc: int
    cfa: int  # CFA = rsp + cfa; -1: another rule (the unwind stops)
    saved: tuple[int, ...]  # the callee-saved registers saved, each at CFA - offset


@dataclass(frozen=True)
class ExitPath:
    """[sp, top): libc's exit frames; `saved`: the addresses of the registers they saved."""

    sp: int
    top: int
    saved: tuple[int, ...]


@dataclass(frozen=True)
class ExitWalk:
    """A thread stopped in libc's `_exit`, unwound: `path` its exit frames when `exit`
    called it; `exit_ran` False when the unwind left libc without meeting `exit` (the
    program called `_exit`, or quick_exit: no atexit handler ran, so LeakSanitizer,
    which checks from one, checked nothing), None when it could not tell."""

    path: ExitPath | None = None
    exit_ran: bool | None = None


def walk_exit(mem: ProcessMemory, maps: list[Mapping], sp: int, pc: int) -> ExitWalk:
    """From `_exit` up through libc's frames until `exit`, or a frame outside libc."""
    mine = [m for m in maps if m.path.rsplit("/", 1)[-1].startswith("libc.so")]
    libc = next((m for m in mine if m.offset == 0), None)
    table = libc_frames(libc.path) if libc is not None else None
    if libc is None or table is None or not table.within(pc - libc.start, "_exit"):
        return ExitWalk()
    inside = (min(m.start for m in mine if m.path == libc.path),
              max(m.end for m in mine if m.path == libc.path))
    cfa, saved = sp, list[int]()  # cfa: the frame's stack pointer, then its CFA
    for _ in range(EXIT_PATH_FRAMES):
        if not inside[0] <= pc < inside[1]:
            return ExitWalk(exit_ran=False)  # returns into its caller, not libc's
        at = pc - libc.start
        row = table.row(at)
        if row is None or row.cfa < 0:
            return ExitWalk()
        cfa += row.cfa
        saved += [cfa - off for off in row.saved]
        if table.within(at, "exit"):
            return ExitWalk(ExitPath(sp, cfa, tuple(saved)), True)
        ret = mem.word(cfa - 8)
        if ret is None:
            return ExitWalk()
        pc = ret - 1  # the call instruction: its row, not the next one's
    return ExitWalk()


@dataclass(frozen=True)
class _Table:
    """libc's rows, by file-relative pc, and where `exit` and `_exit` are."""

    starts: list[int]
    fdes: list[tuple[int, int, list[Any]]]  # rows: Row, or a cache's [pc, cfa, *saved]
    functions: dict[str, tuple[int, int]]

    def within(self, at: int, name: str) -> bool:
        lo, hi = self.functions.get(name, (0, 0))
        return lo <= at < hi

    def row(self, at: int) -> Row | None:
        i = bisect_right(self.starts, at) - 1
        if i < 0 or not self.fdes[i][0] <= at < self.fdes[i][1]:
            return None
        lo, hi, rows = self.fdes[i]
        if rows and not isinstance(rows[0], Row):
            rows = _rows(rows)
            self.fdes[i] = (lo, hi, rows)  # made once: the next lookup finds Rows
        rows = [r for r in rows if r.pc <= at]
        return rows[-1] if rows else None


def _rows(rows: list[Any]) -> list[Row]:
    """A cached FDE's rows, made Rows when first looked up: the exit path looks in four
    FDEs of libc's 3 700 (making them all at each start cost 50 ms); a malformed cache
    row is a row missing, which stops the unwind (the stack is then scanned whole)."""
    try:
        return [Row(int(r[0]), int(r[1]), tuple(map(int, r[2:]))) for r in rows]
    except (TypeError, IndexError, ValueError):
        return []


def libc_frames(path: str) -> _Table | None:
    """libc's CFI rows and its exit functions (file-relative: libc's first mapping is at
    its vaddr 0), read once per libc file (by its real path); None when it cannot be
    read."""
    return _frames(rootpaths.resolve(path))


@cache
def _frames(path: str) -> _Table | None:
    """From the cache (by build-id) when this libc was read before: readelf and parsing
    libc's 40 000 lines took 0.23 s of every run's start (py-spy, `run -- perf report`)."""
    try:
        with open_untrusted(path, ELF_LIMIT, what="module", follow_symlinks=True) as libc:
            build_id = read_build_id(libc.fd_path)
            entry = CACHE_DIR / "exitframes" / f"{build_id}.json" if build_id else None
            table = _from_json(read_cache_json(entry)) if entry else None
            if table is None:
                table = _read_frames(libc.fd_path)
                if entry is not None:
                    _write(entry, table)
    except (UntrustedFileError, BinaryError, OSError):
        return None
    return table


def _read_frames(fd_path: str) -> _Table:
    image = ElfImage(fd_path)
    lines = readelf_frames(fd_path, timeout=60)
    base = image.min_vaddr()
    functions = {name: (s.vaddr - base, s.vaddr - base + s.size)
                 for name in ("exit", "_exit") for s in image.symbols.get(name, [])[:1]}
    fdes = [(lo - base, hi - base, [Row(r.pc - base, r.cfa, r.saved) for r in rows])
            for lo, hi, rows in _parse(lines)]
    return _table(fdes, functions)


def _table(fdes: list[tuple[int, int, list[Any]]], functions: dict[str, tuple[int, int]]
           ) -> _Table:
    fdes.sort(key=lambda f: f[0])
    return _Table([f[0] for f in fdes], fdes, functions)


def _write(entry: Path, table: _Table) -> None:
    """Best effort: an unwritable cache costs a readelf at the next start."""
    fdes = [[lo, hi, [[r.pc, r.cfa, *r.saved] for r in rows]] for lo, hi, rows in table.fdes]
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(entry, json.dumps({"version": _CACHE_VERSION, "fdes": fdes,
                                        "functions": table.functions}).encode())
    except OSError:
        pass


def _from_json(data: Any) -> _Table | None:
    """The cached table, or None when absent or not the shape this version writes (a
    cache entry is a file anyone with the cache's rights may have changed: checked)."""
    try:
        if data["version"] != _CACHE_VERSION:
            return None
        fdes = [(int(lo), int(hi), list(rows)) for lo, hi, rows in data["fdes"]]
        functions = {str(k): (int(v[0]), int(v[1])) for k, v in data["functions"].items()}
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        return None
    return _table(fdes, functions)


def _parse(lines: list[str]) -> list[tuple[int, int, list[Row]]]:
    """The FDEs and their rows (a CFA other than the stack pointer plus an offset: -1);
    an FDE without rows of its own has its CIE's (_exit's)."""
    out: list[tuple[int, int, list[Row]]] = []
    cies: dict[str, list[Row]] = {}
    rows: list[Row] | None = None
    columns: list[str] = []
    for line in lines:
        if m := CIE_LINE.match(line):
            rows = cies.setdefault(m[1].lstrip("0"), [])
        elif m := FDE_LINE.match(line):
            lo = int(m[2], 16)
            rows = []
            out.append((lo, int(m[3], 16), rows))
            rows += [Row(lo, r.cfa, r.saved) for r in cies.get(m[1].lstrip("0"), [])[-1:]]
        elif line.lstrip().startswith("LOC"):
            columns = line.split()
        elif rows is not None and (m := _ROW.match(line)) and "ZERO terminator" not in line:
            cells = dict(zip(columns, line.split(), strict=False))
            saved = tuple(int(cells[r][2:]) for r in SAVED
                          if cells.get(r, "u").startswith("c-"))
            rsp = _RSP.match(m[2])
            row = Row(int(m[1], 16), int(rsp[1]) if rsp else -1, saved)
            if rows and rows[-1].pc == row.pc:  # the CIE's, given again: the FDE's own
                rows.pop()
            rows.append(row)
    return out
