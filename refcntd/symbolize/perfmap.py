"""JIT code named through /tmp/perf-PID.map, the format perf and every JIT share.

Each line is `START SIZE NAME` (hex START and SIZE, the name may contain
spaces).  A JIT writes it while it runs and leaves it behind at exit, so it
is read when the process is reported.  A process in another mount namespace
writes it into its own /tmp under its own pid: that copy is reached through
/proc/PID/root while the process lives, resolved inside that root.

The traced process chooses what is at that path, and refcntd reads it as
root: a FIFO there is refused, not waited on; so is a symbolic link (to a
file only root may read), a file over PERF_MAP_LIMIT, and, as perf requires
(tools/perf/util/symbol.c), a file owned by neither root nor the process
(another user's spoofed names).  A refused map gives no JIT names and one
note for that process.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.inputs.safefs import (
    NO_SUCH_FILE,
    UntrustedFile,
    UntrustedFileError,
    open_untrusted,
)

PERF_MAP_LIMIT = 256 << 20  # a long-running JIT's map is tens of MB


@dataclass(frozen=True)
class PerfMap:
    path: str
    starts: list[int] = field(default_factory=list)
    entries: list[tuple[int, int, str]] = field(default_factory=list)  # start, size, name
    note: str = ""  # why the map at `path` was not read: one line for the process's report

    @classmethod
    def parse(cls, path: str, text: str) -> PerfMap:
        """Later lines win for the same start (a JIT re-emitting code); junk is skipped."""
        by_start: dict[int, tuple[int, int, str]] = {}
        for line in text.splitlines():
            parts = line.strip().split(None, 2)
            if len(parts) != 3:
                continue
            try:
                start, size = int(parts[0], 16), int(parts[1], 16)
            except ValueError:
                continue
            if size > 0:
                by_start[start] = (start, size, parts[2])
        entries = sorted(by_start.values())
        return cls(path, [e[0] for e in entries], entries)

    def lookup(self, ip: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.starts, ip) - 1
        if i < 0:
            return None
        start, size, name = self.entries[i]
        return (name, ip - start) if ip < start + size else None


def perf_map_paths(tgid: int, proc_root: Path = Path("/proc")) -> list[Path]:
    """Where the map of `tgid` may be: its own /tmp while it lives, then the host's."""
    return [root / name if root else Path(name) for root, name in _candidates(tgid, proc_root)]


def _candidates(tgid: int, proc_root: Path) -> list[tuple[Path | None, str]]:
    """(the process's root or None for ours, path inside it)."""
    root = proc_root / str(tgid) / "root"
    own = [(root, f"tmp/perf-{nspid}.map") for nspid in _namespace_pids(tgid, proc_root)]
    return [*own, (None, f"/tmp/perf-{tgid}.map")]


def _status(tgid: int, proc_root: Path, key: str) -> list[int]:
    """The numbers of one line of /proc/PID/status (empty once the process is gone)."""
    try:
        status = (proc_root / str(tgid) / "status").read_text()
    except OSError:
        return []
    for line in status.splitlines():
        if line.startswith(key):
            return [int(p) for p in line.split()[1:] if p.isdigit()]
    return []


def _namespace_pids(tgid: int, proc_root: Path) -> list[int]:
    """The process's pid in each nested pid namespace (innermost first), from NSpid."""
    return _status(tgid, proc_root, "NSpid:")[::-1]


def process_uids(tgid: int, proc_root: Path = Path("/proc")) -> frozenset[int]:
    """Real, effective, saved and file-system uid of a live process (empty once gone)."""
    return frozenset(_status(tgid, proc_root, "Uid:"))


def load_perf_map(tgid: int, proc_root: Path = Path("/proc"),
                  owners: Collection[int] | None = None) -> PerfMap | None:
    """The first map found, or None; a refused one is empty and carries its note.

    `owners`: the uids the process had (learnt while it lived); root may own the
    map too.  None: the uids /proc shows now; once the process is gone only
    root's map is taken.
    """
    allowed = {0, *(process_uids(tgid, proc_root) if owners is None else owners)}
    for root, name in _candidates(tgid, proc_root):
        shown = str(root / name) if root else name
        try:
            with _open(root, name, allowed) as f:
                return PerfMap.parse(shown, f.read_all().decode(errors="replace"))
        except UntrustedFileError as err:
            if not err.missing:
                return PerfMap(shown, note=f"perf map {shown}: {err.reason}: JIT frames "
                                           "not named")
    return None


def _open(root: Path | None, name: str, owners: Collection[int]) -> UntrustedFile:
    if root is None:
        return open_untrusted(name, PERF_MAP_LIMIT, what="perf map", owners=owners)
    try:
        root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise UntrustedFileError(f"perf map {root / name}", NO_SUCH_FILE) from None
    try:
        return open_untrusted(name, PERF_MAP_LIMIT, what="perf map", owners=owners,
                              root_fd=root_fd)
    finally:
        os.close(root_fd)
