"""Modules mapped after tracing began: scanned when exported functions are probed at
their call sites, and their unwind tables loaded before a probed module runs.

Why: a call-site probe only counts the calls it sits on.  For an exported
function, any module can call it through its PLT, including a library
dlopen'ed an hour from now.  The BPF side (bpf/refcntd.c: hold_if_unvetted)
stops a traced process, before its mmap or exec returns, when it maps a file
this module has not scanned; here the file is scanned, its calls are probed,
and the process is continued.  A module whose calls cannot all be probed (it
takes the function's address through its GOT) moves the function back to
its entry probe, with the reason in the report.

The same stop serves the unwinder (knob hold_tables): a process that maps a
probed module while a module it maps has no CFI table yet (a program a script
exec'd after attach, one that serve's target starts) is continued once its
tables are loaded, so its first stacks are as whole as those of `run`'s
command.  Only a process that can be continued is ever stopped (CAP_KILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from refcntd.binary.callsiteplan import importer_sites
from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.plan import Plan
from refcntd.binary.probepoint import return_sites
from refcntd.binary.probesite import CrossModule, ProbeSite
from refcntd.binary.sitemode import MODE_CALLSITES, load_set
from refcntd.errors import BinaryError
from refcntd.kernel.abi import FileKey, HoldKey
from refcntd.kernel.decode import file_key, names_file
from refcntd.kernel.holdmaps import EXIT_HOLD
from refcntd.kernel.parts import HoldMaps, Probes
from refcntd.kernel.program import KernelOptions
from refcntd.paths import RUN_DIR
from refcntd.reach.roots import stat_field
from refcntd.session.unwind import exec_mappings


@dataclass
class VettingStats:
    holds: int = 0  # times a process was stopped to scan what it maps
    held_s: float = 0.0  # total time those processes waited
    table_holds: int = 0  # times a process was stopped for its unwind tables
    table_held_s: float = 0.0
    exec_holds: int = 0  # times a process was stopped at its exec of a new program
    exec_held_s: float = 0.0
    modules: list[str] = field(default_factory=list)  # scanned after start
    probed: dict[str, int] = field(default_factory=dict)  # module -> call-site probes added
    fallbacks: list[str] = field(default_factory=list)  # functions back to their entry probe
    dlsym_missing: str = ""  # why dlsym's results are not watched, if they are not


class Vetting:
    """Which files are accounted for, and what to do with a new one."""

    def __init__(self, probes: Probes, holds: HoldMaps, plan: Plan,
                 type_ids: Callable[[str], int],
                 on_sites: Callable[[list[ProbeSite]], None] = lambda _sites: None,
                 load_tables: Callable[[int], None] | None = None,
                 scan_exec: Callable[[int, FileKey], bool] | None = None) -> None:
        """`on_sites(sites)`: call-site probes added for a module mapped later (the
        symbolizer shows their stacks as entry probes').  `load_tables(tgid)`: the
        unwind tables of what a stopped process maps (None: no table holds).
        `scan_exec(tgid, file)`: whether a process was stopped at its exec of `file` (run:
        the program's own copy of the spec's functions probed; None: no exec holds)."""
        self.probes, self.holds, self.plan, self.type_ids = probes, holds, plan, type_ids
        self.on_sites = on_sites
        self.load_tables = load_tables
        self.scan_exec = scan_exec
        self.stats = VettingStats()
        self._done: set[tuple[int, int]] = set()  # (kernel dev, inode)
        self._coverage: dict[tuple[str, str, str], set[tuple[int, int]]] | None = None
        self._back: set[tuple[str, str, str]] = set()  # (role, function, module) at entry
        # (kernel dev, inode, file offset) of each function dlsym may hand out
        self._functions: dict[tuple[int, int, int], tuple[CrossModule, HoldKey]] = {}
        # processes SIGCONT failed for (pid -> why), retried at every poll and at detach
        self.stuck: dict[int, str] = {}
        # processes another live refcntd holds too: it continues them, or we do once
        # it is gone (retried with the stuck ones)
        self.others: dict[int, str] = {}  # pid -> its start time (pids are reused)
        self.exit_hold: Callable[[int], None] | None = None  # scans a process held at _exit

    @property
    def active(self) -> bool:
        """Scanning modules mapped later (exported functions at their call sites)."""
        return bool(self.plan.cross) and self.holds.enabled

    @property
    def holding(self) -> bool:
        """The BPF side may stop a process: for a scan, or for unwind tables."""
        return self.holds.enabled and (bool(self.plan.cross) or self.load_tables is not None
                                       or self.scan_exec is not None
                                       or self.exit_hold is not None)

    def start(self) -> None:
        """The defining modules and the load set the plan scanned: accounted for.  Where
        the kernel side cannot stop a process that maps a module (no BTF offsets for
        the unwinder's mapping hooks), exported functions go back to their entry."""
        if self.plan.cross and not self.holds.enabled:
            why = continue_blocker() or ("the kernel side cannot follow modules mapped later "
                                         "here (the unwinder's BTF offsets are missing)")
            for cross in self.plan.cross:
                self._fall_back(cross, why)
            return
        if not self.active:
            return
        owners = {c.module for c in self.plan.cross}
        everywhere = self._everywhere()
        for module in owners:  # an owner another function's plan did not scan: not vetted
            keys = [k for k in [file_key(module)] if k is not None]
            if keys and (keys[0].dev, keys[0].ino) in everywhere:
                self._mark([module], owner=True)
            else:
                self.holds.vet(keys, owner=True, vetted=False)
        self._done |= everywhere
        self.holds.vet([FileKey(ino=ino, dev=dev) for dev, ino in everywhere])
        for cross in self.plan.cross:
            key = self._function_key(cross)
            if key is not None:
                self._functions[(key.file.dev, key.file.ino, key.offset)] = (cross, key)
                self.holds.hold_function(key)
        self._probe_dlsym()

    def _probe_dlsym(self) -> None:
        """dlsym hands out a function's address: a probe on each of its `ret`s catches it
        (not a return probe: that breaks RTLD_NEXT host-wide, binary/probepoint.py's
        return_sites).  glibc 2.34+ has dlsym in libc.so.6; an older libdl would need
        its own."""
        try:
            libc = ElfImage(resolve_library("libc.so.6", ElfImage(self.plan.binary)))
        except BinaryError as err:
            self.stats.dlsym_missing = f"dlsym is not probed: {err}"
            return
        offsets = _return_offsets(libc, ("dlsym", "dlvsym"))
        why = self.probes.attach_dlsym(str(libc.path), offsets) if offsets else \
            f"no dlsym whose returns can be probed in {libc.path}"
        if why:
            self.stats.dlsym_missing = f"dlsym is not probed ({why}): a function it hands " \
                "out would be called past its call-site probes, uncounted"

    def _covered(self) -> dict[tuple[str, str, str], set[tuple[int, int]]]:
        """Per function probed at its call sites, the modules its plan scanned: its own
        and the load set of the program and of its module.  libssl, which calls
        libcrypto's X509_up_ref through its PLT, is in that function's plan when the
        program links it, not when a shell exec's the program later."""
        if self._coverage is None:
            self._coverage = {}
            for cross in self.plan.cross:
                paths = [cross.module]
                with contextlib.suppress(BinaryError):
                    paths += [str(m.path) for m in load_set(
                        self.plan.binary, ElfImage(cross.module), resolve_library)]
                self._coverage[self._key(cross)] = {
                    (k.dev, k.ino) for k in map(file_key, paths) if k is not None}
        return self._coverage

    def _everywhere(self) -> set[tuple[int, int]]:
        """The modules every such function's plan scanned: accounted for."""
        covered = list(self._covered().values())
        return set.intersection(*covered) if covered else set()

    def accounted(self, key: FileKey) -> bool:
        """Whether mapping this module needs no scan (the tracer vets the probed modules
        with this: a probed library may call another's exported function)."""
        return not self.active or (key.dev, key.ino) in self._everywhere()

    def _function_key(self, cross: CrossModule) -> HoldKey | None:
        file = file_key(cross.module)
        offset = ElfImage(cross.module).vaddr_to_offset(cross.symbol_vaddr)
        return None if file is None or offset is None else HoldKey(file=file, offset=offset)

    def _mark(self, paths: Iterable[str], owner: bool = False) -> None:
        keys = [k for k in (file_key(p) for p in paths) if k is not None]
        self._done |= {(k.dev, k.ino) for k in keys}
        self.holds.vet(keys, owner)

    def handle_held(self) -> None:
        """Every process the BPF side stopped: load its unwind tables and scan what it
        maps, then continue it."""
        if not self.holding:
            return
        self._retry_stuck()
        for tgid, why in self.holds.take_held().items():
            t0 = time.monotonic()
            marker = mark_held(tgid)
            if why.offset == EXIT_HOLD and self.exit_hold is not None:
                try:
                    self.exit_hold(tgid)  # session/exitscan.py: the scan at its _exit
                finally:
                    self._resume(tgid, marker)
                continue
            load = None if why.offset else self.load_tables  # dlsym: no new mapping
            tables = load is not None
            scanned, execd = len(self.stats.modules), False
            try:
                if self.scan_exec is not None and not why.offset:
                    execd = self.scan_exec(tgid, why.file)
                    self.holds.vet([why.file])  # an exec'd file stops nobody again
                if load is not None:
                    load(tgid)
                if why.offset:
                    self._handed_out(tgid, why)
                else:
                    self.vet_process(tgid)
            except Exception as err:  # noqa: BLE001 - never lose calls, never stay stopped
                for cross in self.plan.cross:
                    if self._key(cross) not in self._back:
                        self._fall_back(cross, f"scanning what process {tgid} maps failed: "
                                               f"{err}")
                if not self.plan.cross:
                    self.stats.fallbacks.append(f"reading what process {tgid} maps (its "
                                                f"program, its unwind tables) failed: {err}")
            finally:
                self._resume(tgid, marker)
                held = time.monotonic() - t0
                if why.offset or len(self.stats.modules) > scanned or not tables:
                    self.stats.holds += 1
                    self.stats.held_s += held
                if execd:
                    self.stats.exec_holds += 1
                    self.stats.exec_held_s += held
                elif tables:
                    self.stats.table_holds += 1
                    self.stats.table_held_s += held

    def continue_all(self) -> None:
        """At detach, once no probe can stop another process: nobody may stay stopped
        because refcntd went away (also the stops whose event was never read)."""
        if self.holding:
            for tgid in self.holds.take_held():
                self._resume(tgid, HELD_DIR / f"{os.getpid()}-{tgid}")
        self._retry_stuck()

    def _resume(self, tgid: int, marker: Path | None) -> None:
        """SIGCONT, unless another live refcntd holds the process too: the last one done
        continues it.  Two instances each stop a process that maps a module with
        functions probed at their call sites; the first to finish its scan used to
        continue it while the other's probes were not there yet, and that instance
        missed the process's calls (a report with no process at all).  Our marker goes
        first: of two finishing at once, one always sees the other's gone.
        A failed SIGCONT is kept, retried and reported, never stranding the rest; the
        marker is written again, so a refcntd with the right continues it."""
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.unlink()
        self.stuck.pop(tgid, None)
        if held_by_another(tgid):
            self.others.setdefault(tgid, _start_time(tgid) or "")
            return
        started = self.others.pop(tgid, None)
        if started is not None and started != (_start_time(tgid) or ""):
            return  # gone, its pid reused: not ours to signal
        why = resume(tgid)
        if why is not None:
            self.stuck[tgid] = why
            mark_held(tgid)

    def _retry_stuck(self) -> None:
        for tgid in [*self.stuck, *self.others]:
            self._resume(tgid, HELD_DIR / f"{os.getpid()}-{tgid}")

    def vet_process(self, tgid: int) -> None:
        """Scan every executable file `tgid` maps that is not accounted for."""
        if not self.active:
            return
        for path, start, end, _off, dev, ino in exec_mappings(Path(f"/proc/{tgid}/maps")):
            if (dev, ino) in self._done:
                continue
            readable = path if names_file(path, dev, ino) else \
                f"/proc/{tgid}/map_files/{start:x}-{end:x}"
            self._vet_file(path, readable, (dev, ino))
            self._done.add((dev, ino))
            self.holds.vet([FileKey(ino=ino, dev=dev)])

    def _vet_file(self, shown: str, path: str, file: tuple[int, int]) -> None:
        self.stats.modules.append(shown)
        try:
            image = ElfImage(path)
        except BinaryError:
            return  # not ELF: it cannot import anything
        covered = self._covered()
        for cross in self.plan.cross:
            if self._key(cross) in self._back or file in covered.get(self._key(cross), ()):
                continue  # back at its entry, or this module's calls are probed already
            try:
                sites, blockers = importer_sites(cross, image)
            except Exception as err:  # noqa: BLE001 - any failure: the entry probe counts
                sites, blockers = [], [f"{shown} could not be scanned: {err}"]
            if blockers:
                self._fall_back(cross, f"{shown} was mapped: {blockers[0]}")
                continue
            if not sites:
                continue
            try:
                added = self.probes.add_sites(sites, self.type_ids)
            except Exception as err:  # noqa: BLE001 - bcc's bare exceptions: entry probe
                self._fall_back(cross, f"{shown} was mapped and its probes failed: {err}")
                continue
            if not added:
                self._fall_back(cross, f"{shown} was mapped and the spare probe slots "
                                       "are used up")
                continue
            refused = [f for f in self.probes.failed_probes if f.site_index in added]
            if refused:
                self._fall_back(cross, f"{shown} was mapped and the kernel refused its "
                                       f"probes: {refused[0].stage}: {refused[0].message}")
                continue
            self.stats.probed[shown] = self.stats.probed.get(shown, 0) + len(sites)
            self.on_sites(sites)

    def _handed_out(self, tgid: int, why: HoldKey) -> None:
        """dlsym returned a function probed at its call sites to `tgid`."""
        found = self._functions.get((why.file.dev, why.file.ino, why.offset))
        if found is not None and self._key(found[0]) not in self._back:
            self._fall_back(found[0], f"dlsym handed its address to process {tgid} "
                                      f"({read_comm(tgid)})")
            self.holds.hold_function(found[1], on=False)

    @staticmethod
    def _key(cross: CrossModule) -> tuple[str, str, str]:
        return cross.role.role, cross.function, cross.module

    def _fall_back(self, cross: CrossModule, why: str) -> None:
        """The function's call sites count nothing from now on; its entry probe does."""
        self._back.add(self._key(cross))
        sites = self.probes.sites
        mine = [i for i, s in enumerate(sites) if s.mode == MODE_CALLSITES and
                s.function == cross.function and (s.callee_module or s.module) == cross.module
                and s.spec_role == cross.role]
        self.probes.disable_sites(mine)
        added = self.probes.add_sites(list(cross.fallback), self.type_ids) \
            if cross.fallback else []
        outcome = "moved back to its entry probe (single-stepped)" if added else \
            "NOT counted from now on: its entry probe could not be added"
        self.stats.fallbacks.append(f"{cross.role.role} {cross.function}: {outcome} "
                                    f"since {why}")

    def notes(self) -> list[str]:
        s = self.stats
        out = [f"process {tgid} ({read_comm(tgid)}) that refcntd stopped to scan a module "
               f"could NOT be continued: {why}; continue it with `kill -CONT {tgid}` as root"
               for tgid, why in sorted(self.stuck.items())]
        if s.table_holds:
            out.append(f"{s.table_holds} stop(s) of a process that mapped a probed module "
                       f"before its unwind tables were loaded ({s.table_held_s * 1000:.0f} ms "
                       f"in all)")
        if s.exec_holds:
            out.append(f"{s.exec_holds} stop(s) of a traced process at its exec of a program "
                       f"not seen before, to probe its own copy of the spec's functions if it "
                       f"has one and load its unwind tables ({s.exec_held_s * 1000:.0f} ms in "
                       f"all)")
        if not self.plan.cross:
            return out + s.fallbacks
        if s.holds:
            out.append(f"{s.holds} stop(s) of a traced process to scan {len(s.modules)} "
                       f"module(s) mapped after start for calls to exported functions "
                       f"probed at their call sites ({s.held_s * 1000:.0f} ms in all)")
        out += [f"{n} call-site probe(s) added in {m}, mapped after start"
                for m, n in s.probed.items()]
        return out + s.fallbacks + ([s.dlsym_missing] if s.dlsym_missing else [])


def read_comm(tgid: int) -> str:
    try:
        return Path(f"/proc/{tgid}/comm").read_text().strip()
    except OSError:
        return "?"



CAP_KILL = 5  # capability bit number (linux/capability.h)


def with_holds(kopts: KernelOptions, cross: bool, execs: bool = False) -> KernelOptions:
    """Which stops this start may make: for the call sites of modules mapped later
    (`cross`: exported functions probed at their call sites), for unwind tables
    whenever the CFI unwinder runs, and (`execs`, run) at each new program the traced
    tree execs.  None without CAP_KILL (continue_blocker)."""
    if continue_blocker() is not None:
        return replace(kopts, hold=False, hold_tables=False, hold_execs=False)
    tables = kopts.unwind_offsets is not None
    execs = execs and tables  # the exec hook is the unwinder's
    return replace(kopts, hold=cross or tables, hold_tables=tables, hold_execs=execs)


def continue_blocker() -> str | None:
    """Why refcntd could not continue a process of another user that it stopped, if
    it could not: then it must never stop one (the shipped unit once lacked CAP_KILL,
    and a www-data service that dlopen()ed a module stayed stopped for good)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("CapEff:") and not int(line.split()[1], 16) >> CAP_KILL & 1:
            return ("refcntd lacks CAP_KILL, which it needs to continue a process of another "
                    "user that it stops while it scans a module the process maps")
    return None


_LIBC = ctypes.CDLL(None, use_errno=True)


def resume(tgid: int) -> str | None:
    """SIGCONT to `tgid`; why it failed, or None (a process gone needs nothing).
    libc's kill through ctypes, which lets go of the GIL (os.kill keeps it): the woken
    process often preempts this thread inside the call, and the report worker waited
    out that preemption, ~1.6 ms a held process (py-spy --gil, fork-heavy run)."""
    if _LIBC.kill(tgid, signal.SIGCONT) == 0:
        return None
    err = ctypes.get_errno()
    return None if err == errno.ESRCH else f"SIGCONT failed: {os.strerror(err)}"


# ---- a refcntd killed while a process waited -------------------------------------
HELD_DIR = RUN_DIR / "held"  # one file per stopped process: "<refcntd pid>-<tgid>"


def mark_held(tgid: int) -> Path | None:
    """Say, before scanning, that this refcntd holds `tgid` stopped: if it is killed
    (SIGKILL, OOM) before the SIGCONT, the next refcntd continues the process.  One
    open and write when the directory is there (every exit hold comes here)."""
    marker = HELD_DIR / f"{os.getpid()}-{tgid}"
    started = (_start_time(tgid) or "").encode()
    try:
        _write_marker(marker, started)
    except FileNotFoundError:
        try:
            HELD_DIR.mkdir(parents=True, exist_ok=True)
            _write_marker(marker, started)
        except OSError:
            return None
    except OSError:
        return None
    return marker


def _write_marker(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def held_by_another(tgid: int) -> bool:
    """A live refcntd other than this one has a marker for `tgid` (the same process:
    its start time), so it has stopped it and will continue it when done.  The
    directory is listed first: mostly nobody else's marker is there."""
    me, suffix = os.getpid(), f"-{tgid}"
    try:
        names = [n for n in os.listdir(HELD_DIR) if n.endswith(suffix)]
    except OSError:
        return False
    started = None
    for name in names:
        owner = name.partition("-")[0]
        if owner.isdigit() and int(owner) != me and _alive(int(owner)):
            if started is None:
                started = _start_time(tgid) or ""
            with contextlib.suppress(OSError):
                if (HELD_DIR / name).read_text() == started:
                    return True
    return False


def continue_orphans() -> list[int]:
    """Continue the processes a dead refcntd left stopped (its markers); the ones
    continued.  A marker of a live refcntd is left alone; a pid that now names
    another process (its start time differs) is not signalled."""
    continued = []
    try:
        markers = list(HELD_DIR.iterdir())
    except OSError:
        return []
    for marker in markers:
        owner, _, tgid = marker.name.partition("-")
        if not (owner.isdigit() and tgid.isdigit()) or _alive(int(owner)):
            continue
        with contextlib.suppress(OSError):
            started = marker.read_text()
            if started and started == _start_time(int(tgid)):
                if resume(int(tgid)) is not None:
                    continue  # kept: a refcntd with CAP_KILL will continue it
                continued.append(int(tgid))
            marker.unlink()
    return continued


def _alive(pid: int) -> bool:
    try:
        return "refcntd" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _start_time(tgid: int) -> str | None:
    """Field 22 of /proc/PID/stat: when the process started (pids are reused)."""
    return stat_field(f"/proc/{tgid}/stat", 19)


def _return_offsets(image: ElfImage, names: Iterable[str]) -> list[int]:
    """File offsets of the `ret` instructions of the functions `names` (each address
    once: dlsym has two versioned names)."""
    vaddrs = {sym.vaddr: sym.size for name in names for sym in image.symbols.get(name, [])}
    rets = {ret for vaddr, size in vaddrs.items()
            for ret in return_sites(image.code_at(vaddr, size), vaddr) or ()}
    return sorted(off for ret in rets if (off := image.vaddr_to_offset(ret)) is not None)
