"""JIT code named through /tmp/perf-PID.map, the format perf and every JIT share.

Each line is `START SIZE NAME` (hex START and SIZE, the name may contain
spaces).  A JIT writes it while it runs and leaves it behind at exit, so it
is read when the process is reported.  A process in another mount namespace
writes it into its own /tmp under its own pid: that copy is reached through
/proc/PID/root while the process lives.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class PerfMap:
    path: str
    starts: list[int] = field(default_factory=list)
    entries: list[tuple[int, int, str]] = field(default_factory=list)  # start, size, name

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
    root = proc_root / str(tgid) / "root" / "tmp"
    out = [root / f"perf-{nspid}.map" for nspid in _namespace_pids(tgid, proc_root)]
    return [*out, Path(f"/tmp/perf-{tgid}.map")]


def _namespace_pids(tgid: int, proc_root: Path) -> list[int]:
    """The process's pid in each nested pid namespace (innermost first), from NSpid."""
    try:
        status = (proc_root / str(tgid) / "status").read_text()
    except OSError:
        return []
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:][::-1] if p.isdigit()]
    return []


def load_perf_map(tgid: int, proc_root: Path = Path("/proc")) -> PerfMap | None:
    for path in perf_map_paths(tgid, proc_root):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        return PerfMap.parse(str(path), text)
    return None
