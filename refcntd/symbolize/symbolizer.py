"""Turn kernel stack records into function+offset, module and file:line.

Works after the traced process is gone: frames arrive as (build-id, file
offset) and build-ids are looked up in an index of ELF files on disk.  Raw
addresses (the caller's return address read at the probe, the type-name
pointer) are placed with the load biases that the paired raw-address stack
reveals for every module on it.  Stripped modules get their symbols and
lines from separate debug files (debugfiles.py), JIT code from the
process's perf map (perfmap.py), and files of processes in other mount
namespaces are read through /proc/PID/root and kept open, so that they can
still be read after the process (and perhaps its container) is gone.

Every path here was named by a traced process, and refcntd reads as root:
files are opened through inputs/safefs.py (a FIFO, a device, a file over
the size cap is refused; a container's paths resolve inside its root), and
a refusal becomes a note for that process (`take_notes`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from refcntd.binary.elf import read_build_id
from refcntd.errors import BinaryError
from refcntd.inputs.files import file_identity, file_stamp
from refcntd.inputs.rootpaths import split_root
from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, open_untrusted
from refcntd.kernel.records import RawFrame
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.modules import ModuleSymbols
from refcntd.symbolize.perfmap import PerfMap, load_perf_map, process_uids

INLINED = "inlined"  # Frame.raw of a function the compiler inlined at the frame's address
MAX_PROCESS_NOTES = 8  # a process naming FIFO after FIFO gets no longer report
V = TypeVar("V")

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

    @property
    def inlined(self) -> bool:
        """A function -O2 folded into the frame below it: no call of its own, the same
        address, its line in its own code."""
        return self.raw == INLINED

    def key(self) -> tuple[str, str, int]:
        """Identity for grouping and baselines: stable across runs and ASLR."""
        if self.function:
            return (Path(self.module).name, self.function, self.offset)
        return (Path(self.module).name or self.raw, "", self.vaddr)

    def describe(self) -> str:
        where = f"{self.function}+0x{self.offset:x}" if self.function else f"0x{self.vaddr:x}"
        if self.inlined:
            where = f"{self.function} (inlined)"
        if not self.module:
            return f"?? {self.raw}"
        src = f" {self.file}:{self.line}" if self.file else ""
        return f"{where}{src} ({self.module})"


FileId = tuple[int, int] | None  # file_identity: (st_dev, st_ino); None: no such file


@dataclass(frozen=True)
class CallSiteFrame:
    """A probed call (or tail jump) instruction and the function it enters."""

    kind: str  # "call" or "jmp"
    callee: int  # vaddr in the same module, or in `callee_module`
    length: int  # of the instruction
    callee_module: str = ""  # a PLT caller's: the module defining the function


class PerProcess(Generic[V]):
    """Facts about recent processes by tgid, for their reports (built on another thread,
    after the process is gone); the oldest are forgotten past `limit`."""

    def __init__(self, limit: int = 4096) -> None:
        self._items: OrderedDict[int, V] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def get(self, tgid: int) -> V | None:
        with self._lock:
            return self._items.get(tgid)

    def put(self, tgid: int, value: V) -> None:
        with self._lock:
            self._items[tgid] = value
            self._items.move_to_end(tgid)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def pop(self, tgid: int) -> V | None:
        with self._lock:
            return self._items.pop(tgid, None)


class BuildIdIndex:
    """build-id -> path, filled from known modules and, on a miss, nearby directories."""

    def __init__(self) -> None:
        self._by_id: dict[str, str] = {}
        self._by_file: dict[tuple[int, int], str] = {}  # (kernel dev, inode) -> path
        self._scanned: set[str] = set()
        self._dirs: list[str] = []
        self._seen: set[str] = set()
        self._names: dict[str, str] = {}  # held-open path -> /proc/PID/root/path
        self._held: dict[tuple[int, int], str] = {}  # (dev, inode) -> held-open path
        self._roots: dict[int, tuple[int, str]] = {}  # tgid -> (root fd, /proc/PID/root)
        self._gone: set[int] = set()  # held roots whose process was gone at the last sweep
        self._uids: PerProcess[frozenset[int]] = PerProcess()  # learnt while it lived
        self._notes: PerProcess[list[str]] = PerProcess()

    def add(self, path: str, tgid: int | None = None) -> str | None:
        """Index the file at `path` (links followed: ld.so's names are links); a refusal
        is a note for process `tgid`.  A path through another root (/proc/PID/root/...)
        is held open: the name its descriptor shows is that root's, not ours."""
        root, inner = split_root(path)
        if root:
            self._add_rooted(root, inner, tgid)
            return None
        try:
            with open_untrusted(path, ELF_LIMIT, what="library", follow_symlinks=True) as f:
                st = os.fstat(f.file.fileno())
                real = os.readlink(f.fd_path)  # the file opened, whatever the name says now
                build_id = read_build_id(f.fd_path)
        except UntrustedFileError as err:
            if tgid is not None and not err.missing:
                self.note(tgid, f"{err.message}: not read")
            return None
        except OSError:
            return None
        self._by_file.setdefault((os.major(st.st_dev) << 20 | os.minor(st.st_dev), st.st_ino),
                                 real)
        if build_id:
            self._by_id.setdefault(build_id, real)
            self.add_search_dir(str(Path(real).parent))
        return build_id

    def _add_rooted(self, root: str, inner: str, tgid: int | None) -> None:
        try:
            fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            self.add_foreign(fd, root, inner, tgid)
        finally:
            os.close(fd)

    def note(self, tgid: int, text: str) -> None:
        notes = self._notes.get(tgid) or []
        if text not in notes and len(notes) < MAX_PROCESS_NOTES:
            self._notes.put(tgid, [*notes, text])

    def take_notes(self, tgid: int) -> list[str]:
        """What was refused for process `tgid`, once."""
        return self._notes.pop(tgid) or []

    def uids(self, tgid: int) -> frozenset[int] | None:
        """The uids process `tgid` had while it was seen alive (None: never seen)."""
        return self._uids.get(tgid)

    def _learn_uids(self, tgid: int, before: frozenset[int] | None) -> None:
        """The uids /proc shows now, with those the process had `before` (an exec keeps
        them; a fork starts from the parent's, not from an older process of that pid)."""
        uids = process_uids(tgid) | (before or frozenset())
        if uids:
            self._uids.put(tgid, uids)

    def add_process_maps(self, maps_file: str) -> None:
        """Index every file a live process maps (best effort: it may be gone already)."""
        proc = Path(maps_file).parent
        tgid = int(proc.name) if proc.name.isdigit() else None
        if tgid is not None:
            self.watch_process(tgid)
        try:
            lines = open(maps_file).read().splitlines()
        except OSError:
            return
        for fields in (line.split(None, 5) for line in lines):
            if len(fields) == 6:
                self.add_library(fields[5], tgid)

    def watch_process(self, tgid: int) -> None:
        """Hold the root of a process in another mount namespace (containers).

        Its paths name files of its own root.  An open descriptor of that root
        keeps it readable after the process, which often lives only a few
        milliseconds, is gone: libraries it reports later are still found.
        """
        self._learn_uids(tgid, self._uids.get(tgid))
        proc = Path(f"/proc/{tgid}")
        if _foreign_root(proc) is None:
            return
        try:
            fd = os.open(proc / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        self.forget_process(tgid)
        self._roots[tgid] = (fd, f"/proc/{tgid}/root")

    def inherit_root(self, child: int, parent: int) -> None:
        """A forked child starts in its parent's root (and with its uids): hold it even if
        the child is gone."""
        self._learn_uids(child, self._uids.get(parent))
        held = self._roots.get(parent)
        if held is not None and child not in self._roots:
            self._roots[child] = (os.dup(held[0]), f"/proc/{child}/root")

    def forget_process(self, tgid: int) -> None:
        """The process is gone and reported: its root is no longer needed."""
        held = self._roots.pop(tgid, None)
        if held is not None:
            os.close(held[0])

    def forget_gone(self, proc: Path = Path("/proc")) -> None:
        """Close the roots of processes gone at this sweep and the one before: a process
        whose exit no tracer reports (seen exec'ing in a container system-wide, never
        traced) held its root open for good (the hour's soak: 12 fds from one test run
        in mount namespaces beside it).  Its events may still be queued at the first
        sweep that finds it gone, so it is closed at the next."""
        gone = {tgid for tgid in self._roots if not (proc / str(tgid)).exists()}
        for tgid in gone & self._gone:
            self.forget_process(tgid)
        self._gone = gone - self._gone

    def add_library(self, path: str, tgid: int | None = None) -> None:
        """A path process `tgid` maps or ld.so reported for it; indexed once."""
        if not path.startswith("/"):
            return
        root = self._roots.get(tgid) if tgid is not None else None
        if root is not None:
            self.add_foreign(root[0], root[1], path, tgid)
        elif path not in self._seen:
            self._seen.add(path)
            self.add(path, tgid)

    def add_foreign(self, root_fd: int, shown_root: str, path: str,
                    tgid: int | None = None) -> None:
        """A file of another mount namespace (resolved inside its root, links too):
        indexed by build-id, kept open."""
        where = f"{shown_root}{path}"
        if where in self._seen:
            return
        self._seen.add(where)
        try:
            with open_untrusted(path, ELF_LIMIT, what="library", follow_symlinks=True,
                                root_fd=root_fd) as f:
                fd = os.dup(f.file.fileno())
        except UntrustedFileError as err:
            if tgid is not None and not err.missing:
                self.note(tgid, f"library {where}: {err.reason}: not read")
            return
        stamp = file_stamp(fd)
        if stamp is None or stamp.identity in self._held:
            os.close(fd)
            return
        held = f"/proc/{os.getpid()}/fd/{fd}"
        self._held[stamp.identity] = held
        self._names[held] = where
        # the unwinder names frames by (kernel dev, inode): find it that way too
        self._by_file.setdefault((stamp.kernel_dev, stamp.ino), held)
        build_id = read_build_id(held)
        if build_id:
            self._by_id.setdefault(build_id, held)

    def display_name(self, path: str) -> str:
        """How the report names a module: its own path, as its process saw it."""
        return self._names.get(path, path)

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
            if _looks_like_elf(entry):
                self.add(str(entry))


def _foreign_root(proc: Path) -> Path | None:
    """`proc`/root when that process's mount namespace is not ours, else None."""
    try:
        if os.readlink(proc / "ns" / "mnt") == os.readlink("/proc/self/ns/mnt"):
            return None
    except OSError:
        return None
    return proc / "root"


def _looks_like_elf(path: Path) -> bool:
    """A regular file (not through a link) starting as ELF does."""
    try:
        with open_untrusted(path, ELF_LIMIT) as f:
            return f.file.read(4) == b"\x7fELF"
    except (UntrustedFileError, OSError):
        return False


# Modules by (path, file stamp, where debug files come from), for every Symbolizer of
# the process: serve's targets all symbolize libc, and a tracer of its own (a target
# added by a reload, an upgraded build) loading it again made ~5 MB of small objects
# whose pymalloc arenas outlived them.  Weak: a module no tracer uses is gone with it.
# The report workers that share one take turns (turn.py).
_SHARED: weakref.WeakValueDictionary[tuple[object, ...], ModuleSymbols] = \
    weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def _shared_key(path: str, finder: DebugFileFinder) -> tuple[object, ...] | None:
    stamp = file_stamp(path)
    if stamp is None:
        return None
    urls = tuple(finder.debuginfod.urls) if finder.debuginfod else ()
    return (path, stamp, finder.debug_dirs, urls)


class Symbolizer:
    """Caches symbol tables and source lines per module across many reports."""

    def __init__(self, index: BuildIdIndex,
                 call_sites: dict[tuple[FileId, int], CallSiteFrame] | None = None,
                 finder: DebugFileFinder | None = None) -> None:
        self.index = index
        # (file identity, vaddr) of call-site probes: a module is placed under whatever
        # name its process made readable (a container's, a held descriptor)
        self.call_sites = call_sites or {}
        self._ids: dict[str, FileId | None] = {}
        self.finder = finder if finder is not None else DebugFileFinder()
        self._modules: dict[str, ModuleSymbols | None] = {}
        self._lines: dict[tuple[str, int], tuple[str, int]] = {}
        self._paths: dict[str, str] = {}  # a frame's module name -> the path it was read from

    def module(self, path: str) -> ModuleSymbols | None:
        cached = self._modules.get(path)
        if path not in self._modules or (cached is not None and cached.pending
                                         and not self.finder.running(cached.image)):
            self._modules[path] = self._load(path)
        return self._modules[path]

    def _load(self, path: str) -> ModuleSymbols | None:
        """Loaded again while its debug file is still downloading; lines learnt anew.
        Another tracer's copy is taken unless this one's finder now finds a debug file
        it lacked (installed since)."""
        key = _shared_key(path, self.finder)
        with _SHARED_LOCK:
            mod = _SHARED.get(key) if key is not None else None
        if mod is not None and mod.debug is None and mod.wants_debug:
            found, final = self.finder.find_image(mod.image)
            if found is not None or not final:  # new, or still downloading: its own load
                mod = None
        if mod is None:
            try:
                mod = ModuleSymbols.load(path, self.finder)
            except BinaryError:
                return None
            # shared only as the file it was read from: not changed since the key's stat
            if key is not None and not mod.pending and _shared_key(path, self.finder) == key:
                with _SHARED_LOCK:
                    _SHARED[key] = mod
        if path in self._modules:
            self._lines = {k: v for k, v in self._lines.items() if k[0] != path}
        return mod

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
            out.append((mod.path, vaddr) if mod and vaddr is not None else None)
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
        # A return address is looked up at the call (-1): after a call to a noreturn
        # function (a forked worker's loop ending in _exit) it is past its caller's end.
        back = 1 if return_address else 0
        function, offset = mod.lookup(vaddr - back) if mod else ("", 0)
        offset += back if function else 0
        file, line = self.source_line(path, vaddr - back)
        shown = self.index.display_name(path)
        self._paths.setdefault(shown, path)
        return Frame(shown, vaddr, function, offset, file, line)

    def module_of(self, frame: Frame) -> ModuleSymbols | None:
        """The loaded module a symbolized frame is in (None for a raw frame)."""
        path = self._paths.get(frame.module)
        return self.module(path) if path and frame.function else None

    def in_own_function(self, frame: Frame) -> Frame:
        """The frame with the line of its own function, not of code inlined into it
        (lines.py): where a report names the line "in" the frame's function.  A frame
        past its function's start holds a return address: its call is at vaddr - 1."""
        path = self._paths.get(frame.module)
        mod = self.module(path) if path and frame.function and not frame.inlined else None
        if mod is None:
            return frame
        file, line = mod.outer_line(frame.vaddr - (1 if frame.offset else 0))
        return replace(frame, file=file, line=line) if file else frame

    def with_inlined(self, frame: Frame) -> tuple[Frame, ...]:
        """The frame preceded by the functions the compiler inlined at its address,
        innermost first: a call written in `map__exit` that -O2 inlined into
        `map__put` shows as map__exit's (raw "inlined").  Each inlined frame has the
        line in its own code; the outer frame that of the outermost inlined call.
        gcc may put an inlined copy of a function inside its own DIE, called at its
        own line: that is no caller, and is left out."""
        path = self._paths.get(frame.module)
        mod = self.module(path) if path and frame.function and not frame.raw else None
        chain = mod.inlined(frame.vaddr - (1 if frame.offset else 0)) if mod else []
        own = frame.function.split(".")[0]
        while chain and chain[0][0] == own:
            chain = chain[1:]
        if not chain or not all(name for name, _ in chain):
            return (frame,)
        lines = [loc for _, loc in chain[1:]] + [(frame.file, frame.line)]
        inner = [Frame(frame.module, frame.vaddr, name, frame.offset, file, line, INLINED)
                 for (name, _), (file, line) in zip(chain, lines, strict=True)]
        file, line = chain[0][1]
        outer = replace(frame, file=file, line=line) if file else frame
        return (*reversed(inner), outer)

    def expand_inlined(self, frames: Iterable[Frame]) -> tuple[Frame, ...]:
        """Every frame with the functions inlined at it: a static helper that -O2 folded
        into its caller is a frame of a stack like any other (its name, its line)."""
        return tuple(f for frame in frames for f in self.with_inlined(frame))

    def perf_map(self, tgid: int, proc_root: Path = Path("/proc")) -> PerfMap | None:
        """The JIT map of `tgid`, checked against the uids it had while alive; a refused
        map is noted for the process's report."""
        perf_map = load_perf_map(tgid, proc_root, self.index.uids(tgid))
        if perf_map is not None and perf_map.note:
            self.index.note(tgid, perf_map.note)
        return perf_map

    def take_notes(self, tgid: int) -> list[str]:
        """One line per file refused for process `tgid` (its perf map, libraries it
        named), for its report; each is given once."""
        return self.index.take_notes(tgid)

    def notes(self) -> list[str]:
        """Refusals that concern the whole run: debug directories and links, debuginfod."""
        return self.finder.all_notes()

    @staticmethod
    def jit_frame(perf_map: PerfMap | None, ip: int, raw: str) -> Frame | None:
        """A frame in JIT code the process described in its perf map."""
        found = perf_map.lookup(ip) if perf_map is not None else None
        if found is None:
            return None
        return Frame(perf_map.path if perf_map else "", ip, found[0], found[1], raw=raw)

    def as_entry_probe(self, first: tuple[str, int] | None, frames: list[Frame]) -> None:
        """Show a call-site probe's stack as an entry probe's: the callee first, then
        the caller at the call's return address.  A tail jump leaves its function off,
        as it is off the stack at the callee's entry."""
        if first is None or not frames:
            return
        path, vaddr = first
        if path not in self._ids:
            self._ids[path] = file_identity(path)
        site = self.call_sites.get((self._ids[path], vaddr))
        if site is None:
            return
        callee = self.frame((site.callee_module or path, site.callee), "", False)
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
        """The lines of many addresses of one module (empty without DWARF)."""
        mod = self.module(path)
        for vaddr in {v for v in vaddrs if (path, v) not in self._lines}:
            self._lines[(path, vaddr)] = mod.line(vaddr) if mod is not None else ("", 0)

