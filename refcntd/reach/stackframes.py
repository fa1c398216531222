"""The frames of a stopped thread's stack, so that a holder on a stack is named by the
function whose frame holds it: `the stack of thread 7 (prog) in frame build (prog)`.

Unwound from the thread's stack pointer and pc (/proc/PID/task/TID/syscall: the thread
held at `_exit`, or blocked in a system call) with each module's `.eh_frame` rows, as
exitframes.py unwinds libc's exit path and read from the same cache: a frame is
[its stack pointer, its CFA), its caller's pc the word below the CFA.  Only rules of
the form CFA = rsp + N are followed (what -O2 code without frame pointers and Debian's
libraries have); a frame whose CFA rule is another (rbp-based: -O0, frame pointers),
a pc outside every file mapping or a word that cannot be read ends the walk, and the
words above it are named by the thread alone, as before.  Read while the process is
stopped (its memory), at most MAX_FRAMES frames.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, open_untrusted
from refcntd.reach.exitframes import libc_frames
from refcntd.reach.memory import Mapping, ProcessMemory

MAX_FRAMES = 64
RED_ZONE = 128  # the x86-64 ABI's area below the stack pointer a leaf function may use


@dataclass(frozen=True)
class StackFrame:
    lo: int  # the frame's stack pointer
    hi: int  # its CFA: the caller's stack pointer before the call
    function: str  # `build (prog)`, `libfoo.so.1+0x1234` without a symbol


def walk(mem: ProcessMemory, maps: list[Mapping], sp: int, pc: int) -> tuple[StackFrame, ...]:
    """The frames from the innermost (at `sp`, running `pc`) outwards."""
    frames: list[StackFrame] = []
    for _ in range(MAX_FRAMES):
        module = _module_at(maps, pc)
        if module is None:
            break
        path, base = module
        table = libc_frames(path)  # any module's rows (the cache is per build-id)
        row = table.row(pc - base) if table is not None else None
        if row is None or row.cfa < 0:
            break
        cfa = sp + row.cfa
        low = sp if frames else sp - RED_ZONE  # (scanned: the innermost frame's red zone)
        frames.append(StackFrame(low, cfa, function_name(path, pc - base)))
        ret = mem.word(cfa - 8)
        if not ret:
            break
        sp, pc = cfa, ret - 1  # the call instruction: its row, not the next one's
    return tuple(frames)


def frame_of(frames: tuple[StackFrame, ...], address: int) -> StackFrame | None:
    """The frame whose words include `address`."""
    return next((f for f in frames if f.lo <= address < f.hi), None)


def _module_at(maps: list[Mapping], pc: int) -> tuple[str, int] | None:
    """(path, where its file's offset 0 is mapped) of the file mapping executing `pc`."""
    for m in maps:
        if m.start <= pc < m.end:
            if not m.path.startswith("/") or "x" not in m.perms or _inode(m.path) != m.inode:
                return None  # (another file by that name here: another mount namespace)
            first = min((x.start - x.offset for x in maps if x.path == m.path), default=0)
            return m.path, first
    return None


def function_name(path: str, at: int) -> str:
    """The function symbol covering file-relative `at`, with the module's name."""
    name = os.path.basename(path)
    starts, rows = _functions(path)
    i = bisect_right(starts, at) - 1
    if i >= 0 and at < rows[i][1]:
        return f"{rows[i][2]} ({name})"
    return f"{name}+{at:#x}"


def _inode(path: str) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


@cache
def _functions(path: str) -> tuple[list[int], list[tuple[int, int, str]]]:
    """(start, end, name) of the module's function symbols, file-relative, by start."""
    try:
        with open_untrusted(path, ELF_LIMIT, what="module", follow_symlinks=True) as f:
            image = ElfImage(f.fd_path)
    except (UntrustedFileError, BinaryError):
        return [], []
    base = image.min_vaddr()
    rows = sorted((s.vaddr - base, s.vaddr - base + max(s.size, 1), name)
                  for name, group in image.symbols.items() for s in group)
    return [r[0] for r in rows], rows
