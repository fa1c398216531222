"""Scans of traced processes held at their exit (bpf/exithold.h), kept until their report.

The uprobe on libc's _exit stops the process after its atexit handlers and
destructors and before its memory goes; the capture thread scans it here (it only
reads) and continues it, as it does for the other holds (session/vetting.py), so
its exit event, and the report that takes the scan, come after.  A process that
leaves without _exit (a signal, a raw exit_group) gets no scan: its report keeps
today's verdicts and says why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.errors import BinaryError
from refcntd.inputs.spec import ClassSource
from refcntd.kernel.parts import Probes
from refcntd.reach import gtypes
from refcntd.reach.exitframes import libc_frames
from refcntd.reach.roots import stat_field
from refcntd.reach.scan import ReachScan, read_process

STOP_WAIT_S = 2.0  # every thread must have taken the SIGSTOP before memory is read
KEPT_LIMIT = 4096  # scans of processes whose exit event is still to come
NOT_SCANNED = "leak kinds not scanned at exit"  # the note that keeps today's verdicts


class ExitScans:
    """Holding at _exit: attach, scan each held process, hand the scan to its report."""

    def __init__(self, probes: Probes, binary: str,
                 classed: Callable[[int], dict[int, ClassSource]] | None = None,
                 set_aside: Callable[[int, list[int]], int] | None = None) -> None:
        """`classed(tgid)`: the process's live objects whose class the spec reads
        (`class:`), named while it is held (reach/gtypes.py); `set_aside(tgid, objects)`:
        those the library flags "may be leaked" (kernel/objects.py)."""
        self.probes, self.binary, self.classed = probes, binary, classed
        self.set_aside = set_aside
        self.results: dict[int, ReachScan] = {}
        self.problem = ""  # why processes are not held at exit, if they are not
        self.scanned = 0
        self.seconds = 0.0  # held, in total
        self.bytes_read = 0  # while held
        self.class_seconds = 0.0  # of `seconds`: objects' classes (kernel map and memory)
        self.classes_read = 0

    def attach(self) -> None:
        """The probe on _exit of the libc the command would load."""
        try:
            libc = ElfImage(resolve_library("libc.so.6", ElfImage(self.binary)))
        except BinaryError as err:
            self.problem = f"libc not found ({err})"
            return
        offsets = [off for sym in libc.symbols.get("_exit", [])
                   if (off := libc.vaddr_to_offset(sym.vaddr)) is not None]
        why = self.probes.attach_exit_hold(str(libc.path), offsets) if offsets else \
            f"no _exit in {libc.path}"
        self.problem = f"the probe on _exit failed: {why}" if why else ""
        if not why:
            libc_frames(str(libc.path))  # read now, not while the first process waits
        if not why and self.classed is not None:
            self._prepare_classes()

    def held(self, tgid: int) -> None:
        """A process stopped at _exit: scan it (the caller continues it, always)."""
        began = time.monotonic()
        stopped = wait_stopped(tgid)
        # only the read needs it stopped: the kinds are made by the report's worker
        # (scan.finish), after it goes on to its exit (fork-heavy runs: ~7 ms less a process)
        scan = read_process(tgid, at_exit=True)
        if self.classed is not None:
            self._name_classes(tgid, scan)
        if not stopped:
            scan.notes.append(f"not every thread had stopped after {STOP_WAIT_S} s: "
                              "scanned while some ran")
        elif scan.complete and not still_stopped(tgid):
            scan.complete = False  # its stacks may have gone mid-scan: no kind is sure
            scan.notes.append(f"{NOT_SCANNED}: the process ran on during the scan (another "
                              "signal continued it); every object alive at exit is a leak, "
                              "as with --no-leak-kinds")
        self.seconds += time.monotonic() - began
        self.scanned += 1
        self.bytes_read += scan.bytes_read
        self.results[tgid] = scan
        while len(self.results) > KEPT_LIMIT:
            self.results.pop(next(iter(self.results)))

    def _prepare_classes(self) -> None:
        """GLib's layouts decoded now (~20 ms), not while the first process waits."""
        try:
            image = ElfImage(self.binary)
            gtypes.prepare(resolve_library(gtypes.GOBJECT_SONAME, image),
                           resolve_library(gtypes.GLIB_SONAME, image))
        except BinaryError:
            pass  # a process maps them later (a plugin): decoded at its exit

    def _name_classes(self, tgid: int, scan: ReachScan) -> None:
        assert self.classed is not None
        began = time.monotonic()
        objects = self.classed(tgid)
        found = gtypes.read_classes(tgid, objects) if objects else gtypes.ClassNames()
        if found.kept and self.set_aside is not None:
            self.set_aside(tgid, found.kept)  # before its report drains its objects
        scan.classes = found.names
        scan.notes += gtypes.note(found)
        self.class_seconds += time.monotonic() - began
        self.classes_read += len(objects)

    def take(self, tgid: int) -> ReachScan | None:
        return self.results.pop(tgid, None)

    def notes(self) -> list[str]:
        if self.problem:
            return [f"{NOT_SCANNED}: {self.problem}; every object alive at exit is a leak, "
                    "as with --no-leak-kinds"]
        if not self.scanned:
            return []
        classes = f" ({self.classes_read} object classes read in " \
            f"{self.class_seconds:.3f} s)" if self.classes_read else ""
        return [f"{self.scanned} process(es) scanned at exit for leak kinds: "
                f"{self.bytes_read / 2**20:.1f} MiB read, held {self.seconds:.3f} s "
                f"in total{classes}"]


def wait_stopped(pid: int, proc: Path = Path("/proc"), timeout_s: float = STOP_WAIT_S) -> bool:
    """Whether every thread of `pid` is stopped (state T) before `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if all(s in ("T", "t", "X", "Z", "") for s in _states(proc, pid)):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.0005)


def still_stopped(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether every thread of `pid` is stopped now (not running, not exited)."""
    states = _states(proc, pid)
    return bool(states) and all(s in ("T", "t") for s in states)


def _states(proc: Path, pid: int) -> list[str]:
    """Each thread's state letter ("" for one gone meanwhile): os.listdir and plain
    reads, twice per held process (pathlib's glob and read_text were ~0.2 ms of it)."""
    tasks = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return []
    return [stat_field(f"{tasks}/{tid}/stat", 0) or "" for tid in tids]
