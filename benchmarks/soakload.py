"""The soak's churn (benchmarks/soak.py): short-lived traced processes at a set rate,
each printing its own truth, and the check of every report serve writes against it."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

Summary = dict[str, list[int]]  # type -> sorted final counts of its leaked objects
MODES = (("once", 60), ("fork", 15), ("exec", 15), ("kill", 10))  # mode, weight (%)
MAX_IN_FLIGHT = 32


def parse_truth(line: str) -> tuple[int, Summary]:
    """"TRUTH pid=P conn=1,2 req= buf=3" -> (P, {"conn": [1, 2], "buf": [3]})."""
    words = line.split()
    pid = int(words[1].removeprefix("pid="))
    out: Summary = {}
    for word in words[2:]:
        name, _, counts = word.partition("=")
        if counts:
            out[name] = sorted(int(c) for c in counts.split(","))
    return pid, out


def report_summary(process: dict) -> Summary:
    out: Summary = {}
    for group in process["groups"]:
        out.setdefault(group["type"], []).extend(i["count"] for i in group["instances"])
    return {k: sorted(v) for k, v in out.items()}


@dataclass
class Churn:
    """Launches `rate` processes a minute over the active targets' programs, unless paused."""

    programs: dict[str, Path]  # target -> program to run
    rate: float
    # (target, pid) -> truths, oldest first: pid_max is 32768 here, and an hour launches
    # 58 000 processes, so a pid comes back while its first process's report is pending
    truth: dict[tuple[str, int], list[Summary]] = field(default_factory=dict)
    launched: int = 0
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    running: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT)
        self._rng = random.Random(43)
        self._thread = threading.Thread(target=self._pace, daemon=True)
        self.running.set()
        self._thread.start()

    def _pace(self) -> None:
        period, next_at = 60.0 / self.rate, time.monotonic()
        while not self.stopped:
            self.running.wait()
            now = time.monotonic()
            if now < next_at:
                time.sleep(min(next_at - now, 0.5))
                continue
            next_at = max(next_at + period, now - 1.0)  # no burst to catch up a pause
            with self.lock:
                if not self.running.is_set() or self.in_flight >= MAX_IN_FLIGHT:
                    continue
                self.in_flight += 1
                target = self._rng.choice(sorted(self.programs))
                mode = self._rng.choices([m for m, _ in MODES], [w for _, w in MODES])[0]
                seed = self._rng.randrange(1 << 30)
            self._pool.submit(self._one, target, mode, seed)

    def take_truth(self, target: str, pid: int) -> Summary | None:
        """The oldest truth of `pid` not yet checked (the caller holds the lock)."""
        left = self.truth.get((target, pid))
        if not left:
            return None
        truth = left.pop(0)
        if not left:
            del self.truth[(target, pid)]
        return truth

    def _one(self, target: str, mode: str, seed: int) -> None:
        try:
            lines = self._spawn(self.programs[target], mode, seed)
            with self.lock:
                for line in lines:
                    pid, summary = parse_truth(line)
                    self.truth.setdefault((target, pid), []).append(summary)
                self.launched += 1
        except Exception as err:  # noqa: BLE001 - counted and shown, the churn goes on
            with self.lock:
                self.failed.append(f"{target} {mode} {seed}: {err}")
        finally:
            with self.lock:
                self.in_flight -= 1

    @staticmethod
    def _spawn(program: Path, mode: str, seed: int) -> list[str]:
        with subprocess.Popen([str(program), mode, str(seed)], stdout=subprocess.PIPE,
                              text=True) as proc:
            assert proc.stdout is not None
            if mode == "kill":  # its truth first, then the kill
                lines = [proc.stdout.readline()]
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
                return lines
            out, _ = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"exit {proc.returncode}")
        return [line for line in out.splitlines() if line.startswith("TRUTH")]

    def pause(self, timeout: float = 60) -> None:
        """No new process, and every launched one finished."""
        self.running.clear()
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)

    def resume(self) -> None:
        self.running.set()

    def set_programs(self, programs: dict[str, Path]) -> None:
        with self.lock:
            self.programs = dict(programs)

    def stop(self) -> None:
        self.pause()
        self.stopped = True
        self.running.set()
        self._thread.join()
        self._pool.shutdown()


@dataclass
class Checker:
    """Reads each new report of serve's report_dir and compares it with the truth."""

    reports: Path
    churn: Churn
    exact: int = 0
    wrong: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    # reports read before their process's truth was recorded (the report of a process
    # can be written before the churn thread, woken by its exit, records what it printed):
    # checked again at each scan, unexpected only if still without a truth at the end
    orphans: dict[str, tuple[str, dict]] = field(default_factory=dict)

    @property
    def unexpected(self) -> list[str]:
        return [f"{target} {data['processes'][0]['pid']} {data['processes'][0]['state']}"
                for target, data in self.orphans.values()]

    def scan(self) -> None:
        for path in sorted(self.reports.glob("*.json")) if self.reports.is_dir() else []:
            if path.name in self.seen or "-diff-" in path.name:
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # pruned, or being written: next scan
            self.seen.add(path.name)
            target = path.stem.split("-")[-2]
            if not data["tracing"]["complete"] or data["tracing"]["lost"]:
                self.incomplete.append(f"{target} {data['processes'][0]['pid']}: "
                                       f"{data['tracing']['lost']}")
            self.orphans[path.name] = (target, data)
        for name, (target, data) in list(self.orphans.items()):
            if self._check(target, data):
                del self.orphans[name]

    def _check(self, target: str, data: dict) -> bool:
        """False while the process's truth is not recorded yet."""
        (process,) = data["processes"]
        pid = process["pid"]
        with self.churn.lock:
            truth = self.churn.take_truth(target, pid)
        if truth is None:
            return False
        if truth == report_summary(process):
            self.exact += 1
        else:
            self.wrong.append(f"{target} {pid}: truth {truth}, report "
                              f"{report_summary(process)}")
        return True

    def missing(self) -> list[str]:
        """Truths still without a report (call once the processes are gone)."""
        with self.churn.lock:
            return [f"{t} {p}" for (t, p), left in self.churn.truth.items() for _ in left]

    def settle(self, timeout: float = 30) -> None:
        """Scan until every finished process has its report, or `timeout`."""
        deadline = time.monotonic() + timeout
        self.scan()
        while (self.missing() or self.orphans) and time.monotonic() < deadline:
            time.sleep(0.25)
            self.scan()
