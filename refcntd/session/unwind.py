"""Which modules get CFI tables, and when: before the traced code runs where possible.

The BPF unwinder (bpf/unwind.h) follows each process's executable mappings
itself, but the tables must be in the kernel before a stack passes through
a module.  They are loaded for the probed modules, the command of `run`,
the processes found at attach, and everything those link against (DT_NEEDED),
before tracing starts; for libraries dlopen'ed later and programs exec'ed
later as soon as their event arrives (stacks recorded before then use
frame pointers there, or stop with "no unwind table", counted).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.sitemode import load_set
from refcntd.errors import BinaryError, ScriptError
from refcntd.inputs import rootpaths
from refcntd.kernel import cfi
from refcntd.kernel.cfi import CfiTable
from refcntd.kernel.decode import file_key, names_file
from refcntd.kernel.parts import UnwindMaps
from refcntd.reach.exitframes import libc_frames

PREFETCH_THREADS = 3  # readelf runs outside the GIL; parsing its output does not


class UnwindTables:
    """Loads each file's table once; remembers the files that could not be read."""

    def __init__(self, kernel: UnwindMaps, ready: Prefetched | None = None) -> None:
        """`ready`: prefetch()'s tables, read before the kernel side was loaded."""
        self.kernel = kernel
        self._done: set[object] = set()  # (dev, inode) of each file tried; else its path
        self.failed: list[str] = []
        self._ready = ready or Prefetched()

    def add(self, paths: Iterable[str], with_deps: bool = True) -> None:
        if not self.kernel.enabled:
            return
        for path in paths:
            if _identity(path) in self._done:
                continue
            deps = self._ready.deps.get(path)
            for module in [path, *((deps if deps is not None else linked_libraries(path))
                                   if with_deps else [])]:
                self._load(module)

    def _load(self, path: str) -> None:
        """Once per file: a path upgraded in place (a new inode) is a new file."""
        identity = _identity(path)
        if identity in self._done:
            return
        self._done.add(identity)
        if not _is_elf(path):  # JIT code in a file (ORC's orcexec.*): no table to have
            self.kernel.mark_without_table(path)
            return
        try:
            ready = self._ready.tables.pop(path, None)
            if isinstance(ready, Exception):
                raise ready
            self.kernel.load_table(path, ready)
        except ScriptError:  # exec'd, never mapped: its interpreter is the module
            self.kernel.mark_without_table(path)
        except (BinaryError, OSError) as err:
            self.failed.append(f"{path}: {err}")
            self.kernel.mark_without_table(path)

    def load_for_process(self, tgid: int) -> None:
        """A process stopped by the BPF side (hold.h) because it maps a probed module
        while some of its modules have no table: every file it maps, and what each
        links against, get theirs before it runs on (its mappings are followed by
        the BPF side since its exec).  A file of another mount namespace is read
        through /proc/PID/map_files, the same inode."""
        if not self.kernel.enabled:
            return
        for path, start, end, _off, dev, ino in exec_mappings(Path(f"/proc/{tgid}/maps")):
            same = names_file(path, dev, ino)
            self.add([path if same else _map_file(tgid, start, end)], with_deps=same)

    def seed_process(self, tgid: int) -> None:
        """A process running before tracing began: its mappings and their tables."""
        if not self.kernel.enabled:
            return
        maps = exec_mappings(Path(f"/proc/{tgid}/maps"))
        self.add({path if names_file(path, dev, ino) else _map_file(tgid, start, end)
                  for path, start, end, _off, dev, ino in maps}, with_deps=False)
        self.kernel.seed_exec_maps(tgid, [m[1:] for m in maps])


def _map_file(tgid: int, start: int, end: int) -> str:
    """A mapping's file through the process: deleted since (`PATH (deleted)`), or of
    another mount namespace."""
    return f"/proc/{tgid}/map_files/{start:x}-{end:x}"


def _is_elf(path: str) -> bool:
    """Whether `path` starts as an ELF file does; True when it cannot be read (the
    load then says why).  Code a JIT wrote into a file and mapped (GStreamer's ORC:
    `/tmp/orcexec.* (deleted)`) is not one, and no user can give it a table."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted there never waits
    except OSError:
        return True
    try:
        return not stat.S_ISREG(os.fstat(fd).st_mode) or os.read(fd, 4) == b"\x7fELF"
    except OSError:
        return True
    finally:
        os.close(fd)


def _identity(path: str) -> object:
    key = file_key(path)
    return path if key is None else (key.dev, key.ino)


@dataclass
class Prefetched:
    """Tables and dependencies read ahead (no kernel needed): attach overlaps this with
    the end of the BPF compile."""

    deps: dict[str, list[str]] = field(default_factory=dict)
    tables: dict[str, CfiTable | BinaryError | OSError] = field(default_factory=dict)


def prefetch(paths: Iterable[str]) -> Prefetched:
    """Each module's table, and those of what it links against.  A table not cached
    runs readelf, a process of its own: PREFETCH_THREADS of them at once (perf and the
    five libraries it links: 0.7 s one after another, issue 43)."""
    out = Prefetched()
    for path in paths:
        out.deps[path] = linked_libraries(path)
    modules = list(dict.fromkeys(m for p in out.deps for m in [p, *out.deps[p]]))
    with ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="cfi") as pool:
        out.tables.update(zip(modules, pool.map(_table_or_error, modules), strict=True))
    return out


def prebuild_common(program: str = "/bin/sh") -> list[str]:
    """`refcntd prebuild`: cache the tables of the C library and the dynamic loader (what
    /bin/sh links against), which nearly every traced program maps: 0.25 s of readelf
    and parsing that a first run no longer waits for, and the C library's exit frames
    (the leak-kinds scan's, 0.23 s more).  Returns the modules done."""
    tables = prefetch([program]).tables
    for module in tables:
        if os.path.basename(module).startswith("libc.so"):
            libc_frames(module)
    return [m for m, t in tables.items() if isinstance(t, CfiTable)]


def _table_or_error(module: str) -> CfiTable | BinaryError | OSError:
    try:
        return cfi.load_table(module)
    except (BinaryError, OSError) as err:
        return err


def command_path(command: list[str]) -> str | None:
    """The command's file, or None if not found."""
    found = shutil.which(command[0]) if command else None
    return rootpaths.resolve(found) if found else None


def linked_libraries(path: str) -> list[str]:
    """The shared libraries `path` loads at start: DT_NEEDED, transitively, found the way
    ld.so would (empty for static or non-ELF files). Not ldd: it runs the dynamic loader,
    as root, on a file a traced process may have chosen."""
    try:
        image = ElfImage(path)
        modules = load_set(path, image, resolve_library)
    except BinaryError:
        return []
    own = rootpaths.resolve(image.path)
    return [str(m.path) for m in modules if rootpaths.resolve(m.path) != own]


def exec_mappings(maps_file: Path) -> list[tuple[str, int, int, int, int, int]]:
    """(path, start, end, file offset, kernel dev, inode) of each executable file mapping."""
    try:
        lines = maps_file.read_text().splitlines()
    except OSError:
        return []
    out = []
    for fields in (line.split(None, 5) for line in lines):
        if len(fields) < 6 or "x" not in fields[1] or not fields[5].startswith("/"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        major, minor = (int(x, 16) for x in fields[3].split(":"))
        out.append((fields[5], start, end, int(fields[2], 16), major << 20 | minor,
                    int(fields[4])))
    return out
