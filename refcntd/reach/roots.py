"""Where a scan starts: what the program can reach without going through the heap.

As valgrind and LeakSanitizer do: the writable data of every loaded module (.data,
.bss, the GOT), each thread's stack from its stack pointer up (a thread's TLS and
`struct pthread` sit at the top of its stack mapping in glibc), the registers the
kernel shows (the arguments of a blocked system call), and any other writable
mapping that is not malloc's.  Below a stack pointer nothing is scanned: those are
dead frames.  A stack mapping no live thread is on (glibc caches the stacks of
exited threads) is not scanned either.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from refcntd.reach.chunks import HEAP_MAX
from refcntd.reach.exitframes import ExitPath
from refcntd.reach.memory import Mapping
from refcntd.reach.stackframes import RED_ZONE, StackFrame, frame_of

SKIPPED = ("[vvar]", "[vsyscall]", "[vdso]", "[uprobes]", "[vvar_vclock]")


@dataclass(frozen=True)
class Thread:
    tid: int
    comm: str
    sp: int | None  # None: the kernel did not say (the thread was running)
    registers: tuple[int, ...] = ()  # a blocked system call's arguments
    pc: int = 0  # where it stopped (0: not said)
    syscall: int | None = None  # the system call it is in; -1: none, stopped while running


@dataclass(frozen=True)
class Root:
    start: int
    end: int
    what: str  # "module", "stack", "registers", "mapping"
    owner: str  # the module's path, the thread ("2 (gdbus)"), or the mapping
    base: int = 0  # where the module's file is mapped (its first mapping)
    values: tuple[int, ...] = ()  # registers: the words themselves
    frames: tuple[StackFrame, ...] = ()  # a stack: its thread's frames (stackframes.py)


def read_threads(pid: int, proc: Path = Path("/proc")) -> list[Thread]:
    """Each thread's stack pointer and registers from /proc/PID/task/TID/syscall, which
    the kernel fills only for a thread that is not running (stopped or blocked)."""
    out = []
    tasks = f"{proc}/{pid}/task"
    try:
        tids = sorted(int(t) for t in os.listdir(tasks))
    except OSError:
        return []
    for tid in tids:
        try:
            fields = _read(f"{tasks}/{tid}/syscall").split()
            comm = _read(f"{tasks}/{tid}/comm").strip()
        except OSError:
            continue
        if len(fields) < 3 or fields[0] == "running":
            out.append(Thread(tid, comm, None))
            continue
        args = tuple(int(v, 16) for v in fields[1:-2])
        out.append(Thread(tid, comm, int(fields[-2], 16), args, int(fields[-1], 16),
                          int(fields[0])))
    return out


def _read(path: str) -> str:
    """A small /proc file (pathlib's read_text costs more than the read, per thread)."""
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def stat_field(path: str, index: int) -> str | None:
    """Field `index` after the command of a /proc/.../stat file (0: the state letter,
    19: the start time), or None when it cannot be read: held processes are checked
    this way several times each, so no pathlib."""
    try:
        return _read(path).rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def find_roots(maps: list[Mapping], threads: list[Thread], pid: int,
               heap_regions: list[tuple[int, int]],
               exiting: dict[int, ExitPath] | None = None,
               frames: dict[int, tuple[StackFrame, ...]] | None = None
               ) -> tuple[list[Root], list[str]]:
    """The root ranges and the notes on what could not be scanned as a scan should.
    `exiting`: per thread held in `_exit`, libc's exit frames (exitframes.py), of
    which only the registers they saved are scanned; `frames`: per thread, its stack's
    frames, which name a holder on it."""
    notes: list[str] = []
    stacks = stack_mappings(maps)
    unknown_sp = [t for t in threads if t.sp is None]
    if unknown_sp:
        notes.append(f"{len(unknown_sp)} thread(s) without a stack pointer (running): "
                     "their whole stack mapping scanned")
    on_stack: dict[int, Root] = {}
    roots: list[Root] = []
    for t in threads:
        m = _containing(maps, t.sp) if t.sp is not None else None
        if m is None:
            continue
        low = max(m.start, (t.sp - RED_ZONE) & ~7)  # type: ignore[operator]
        path = (exiting or {}).get(t.tid)
        walked = (frames or {}).get(t.tid, ())
        if path is not None:
            low = path.top
            roots += [Root(a, a + 8, "stack", f"{t.tid} ({t.comm})", frames=walked)
                      for a in path.saved]
        on_stack[m.start] = Root(low, m.end, "stack", f"{t.tid} ({t.comm})", frames=walked)
    module, base, last_end = "", 0, 0
    for m in maps:
        if m.path and not m.path.startswith("["):
            if m.path != module:
                module, base = m.path, m.start - m.offset
        elif m.path or m.start != last_end:  # a module's .bss: anonymous, right after it
            module = ""
        last_end = m.end
        if not m.writable or m.path in SKIPPED or _inside(m, heap_regions):
            continue
        if m.start in on_stack:
            roots.append(on_stack[m.start])
        elif m.start in stacks or m.path == "[stack]":
            if unknown_sp:
                roots.append(Root(m.start, m.end, "stack", "of an unknown thread"))
        elif module:
            roots.append(Root(m.start, m.end, "module", module, base))
        else:
            roots.append(Root(m.start, m.end, "mapping", f"{m.start:#x}-{m.end:#x}"))
    # last: a block reached from several roots is named after the first, and a global or
    # a stack says more than a blocked system call's argument
    roots += [Root(0, 0, "registers", f"{t.tid} ({t.comm})", values=t.registers)
              for t in threads if t.registers]
    return roots, notes


def stack_mappings(maps: list[Mapping]) -> set[int]:
    """Anonymous writable mappings right above an inaccessible one: glibc's thread
    stacks with their guard page (cached ones too).  Not a thread arena's heap, which
    lies so when the kernel maps it right above the previous heap's reserve (a live
    copy left such a heap out, and the GSlice slabs in it: issue 58)."""
    out = set()
    for i, (below, m) in enumerate(zip(maps, maps[1:], strict=False)):
        if (not m.path and m.writable and below.end == m.start and not below.path
                and below.perms.startswith("---") and not _arena_heap(maps, i + 1)):
            out.add(m.start)
    return out


def _arena_heap(maps: list[Mapping], i: int) -> bool:
    """Whether maps[i] is a thread arena's heap (glibc's new_heap): HEAP_MAX bytes at
    a HEAP_MAX boundary, its part not yet in use inaccessible."""
    m, rest = maps[i], maps[i + 1] if i + 1 < len(maps) else None
    end = rest.end if rest is not None and rest.start == m.end and not rest.path and \
        rest.perms.startswith("---") else m.end
    return m.start % HEAP_MAX == 0 and end == m.start + HEAP_MAX


def _containing(maps: list[Mapping], address: int) -> Mapping | None:
    for m in maps:
        if m.start <= address < m.end:
            return m
    return None


def _inside(m: Mapping, regions: list[tuple[int, int]]) -> bool:
    return any(s <= m.start < e for s, e in regions)


def describe(root: Root, address: int) -> str:
    """`global the_bus (libgio-2.0.so.0)`, `the stack of thread 2 (gdbus) in frame
    g_main_loop_run (libglib-2.0.so.0)` ..."""
    if root.what == "stack":
        frame = frame_of(root.frames, address)
        return f"the stack of thread {root.owner}" + (f" in frame {frame.function}"
                                                      if frame else "")
    if root.what == "registers":
        return f"the registers of thread {root.owner}"
    if root.what == "mapping":
        return f"the mapping {root.owner}"
    name = Path(root.owner).name
    symbol = global_at(root.owner, address - root.base)
    return f"global {symbol} ({name})" if symbol else f"data of {name} at +{address - root.base:#x}"


def describe_slot(root: Root, address: int) -> str:
    """The word at `address` of a root: `global dsos+0x10 (perf)`, `data of libx.so at
    +0x2010`, `the stack of thread 7 (perf)`, `a register of thread 7 (perf)`."""
    if root.what == "registers":
        return f"a register of thread {root.owner}"
    if root.what != "module":
        return describe(root, address)
    found = symbol_at(root.owner, address - root.base)
    name = Path(root.owner).name
    if found is None:
        return f"data of {name} at +{address - root.base:#x}"
    symbol, offset = found
    return f"global {symbol}{f'+{offset:#x}' if offset else ''} ({name})"


def global_at(path: str, offset: int) -> str | None:
    """The data symbol covering `offset` (from the file's start as mapped), if any."""
    found = symbol_at(path, offset)
    return found[0] if found else None


def symbol_at(path: str, offset: int) -> tuple[str, int] | None:
    """The data symbol covering `offset` and the offset into it."""
    table = data_symbols(path)
    i = bisect_right(table, (offset, "\uffff")) - 1
    if i < 0:
        return None
    start, name, size = table[i][0], table[i][1], table[i][2]
    return (name, offset - start) if start <= offset < start + max(size, 8) else None


@cache
def data_symbols(path: str) -> list[tuple[int, str, int]]:
    """(file-relative address, name, size) of data symbols, .symtab before .dynsym."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            base = min((s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"),
                       default=0) & ~0xFFF
            rows = {}
            for table in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(table)
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] in ("STT_OBJECT", "STT_TLS") and sym["st_value"]:
                        rows[sym["st_value"] - base] = (sym.name, sym["st_size"])
    except (OSError, ELFError, ValueError):
        return []
    return sorted((a, n, s) for a, (n, s) in rows.items())
