"""Per-process report files for the daemon, kept within count, age and size.

Names sort by time: 20261122T001500.123456Z-<target>-<pid>.json (and .txt).
Stacks and command lines can be sensitive, so files are 0640 in a 0750
directory.  A failed write is logged and counted by the caller; it never
stops the daemon.

The files kept are indexed in memory (name and size, oldest first), so a write
prunes in O(1): listing and stat'ing the whole directory at every write made each
report cost O(max_reports) (the soak, issue 43: 57 % of the report worker's time
at 3 000 reports kept).  The directory is read again on the retention timer
(`prune()`), which sees files removed or changed by others.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from refcntd.inputs.config import Retention
from refcntd.outputs.jsontypes import RunJson

FILE_MODE = 0o640
DIR_MODE = 0o750


@dataclass
class StoreStats:
    written: int = 0
    errors: int = 0
    pruned: int = 0


class ReportStore:
    def __init__(self, directory: str, retention: Retention,
                 clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(directory)
        self.retention = retention
        self.clock = clock
        self.stats = StoreStats()
        self.lock = threading.RLock()  # report workers of several tracers, the retention timer
        self._kept: deque[tuple[Path, int]] | None = None  # (json path, pair size), oldest first
        self._kept_bytes = 0

    def write(self, target: str, pid: int, data: RunJson, text: str) -> Path:
        """Write one process's report (JSON and text); raises OSError on failure."""
        with self.lock:
            return self._write(target, pid, data, text)

    def _write(self, target: str, pid: int, data: RunJson, text: str) -> Path:
        stamp = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        base = f"{stamp}-{target}-{pid}"
        try:
            self.dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            size = _write_private(self.dir / f"{base}.json", json.dumps(data, indent=2) + "\n")
            size += _write_private(self.dir / f"{base}.txt", text)
        except OSError:
            self.stats.errors += 1
            for suffix in (".json", ".txt"):  # no half-written pair left behind
                with contextlib.suppress(OSError):
                    (self.dir / f"{base}{suffix}").unlink(missing_ok=True)
            raise
        self.stats.written += 1
        self._remember(self.dir / f"{base}.json", size)
        self._prune()
        return self.dir / f"{base}.json"

    def _remember(self, path: Path, size: int) -> None:
        kept = self._kept
        if kept is None or (kept and path.name < kept[-1][0].name):
            self._kept = None  # not read yet, or the clock went back: read the directory
            return
        kept.append((path, size))
        self._kept_bytes += size

    def reports(self) -> list[Path]:
        """Report JSON files, oldest first."""
        try:
            return sorted(self.dir.glob("*.json"))
        except OSError:
            return []

    def prune(self) -> None:
        """Drop the oldest reports beyond the count, age and total-size limits, from
        the directory as it is now (files removed or changed by others included)."""
        with self.lock:
            self._kept = None
            self._prune()

    def _prune(self) -> None:
        if self._kept is None:
            self._kept = deque((p, _pair_size(p)) for p in self.reports())
            self._kept_bytes = sum(size for _, size in self._kept)
        kept, cutoff = self._kept, self.clock() - self.retention.max_age_s
        while kept:
            path, size = kept[0]
            too_many = len(kept) > self.retention.max_reports
            too_big = self._kept_bytes > self.retention.max_bytes and len(kept) > 1
            if not (too_many or too_big or _mtime(path) < cutoff):
                break
            kept.popleft()
            self._kept_bytes -= size
            for sibling in _pair(path):
                sibling.unlink(missing_ok=True)
            self.stats.pruned += 1


def _write_private(path: Path, text: str) -> int:
    """Bytes written."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return len(data)


def _pair(json_path: Path) -> tuple[Path, Path]:
    """The .json and .txt of one report (names contain dots: no with_suffix)."""
    return json_path, json_path.with_name(json_path.name[: -len(".json")] + ".txt")


def _pair_size(path: Path) -> int:
    return sum(_stat_size(p) for p in _pair(path))


def _stat_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
