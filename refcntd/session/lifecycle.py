"""Per-process bookkeeping: fork, exec and exit events become process reports.

Exit is taken from the BPF ring buffer, which delivers a process's exit after
all its own events; the process's objects are then drained from the kernel
map and symbolized from files, since its memory map is already gone.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from refcntd.analysis.classes import apply_classes
from refcntd.analysis.holderevidence import decide as decide_by_holders
from refcntd.analysis.kinds import apply_kinds
from refcntd.analysis.leaks import (
    HistoryContext,
    ProcessModules,
    StackSource,
    anomaly_findings,
    group_columns,
    group_leaks,
    operation_paths,
    unnamed_operations,
)
from refcntd.analysis.model import (
    STATE_EXIT_NOT_SEEN,
    STATE_EXITED,
    STATE_LIVE_AT_DETACH,
    ProcessReport,
)
from refcntd.analysis.released import set_aside_released
from refcntd.inputs.config import COMM_MAX
from refcntd.kernel.abi import AnomalyKind, EventKind
from refcntd.kernel.columns import ObjectColumns
from refcntd.kernel.parts import Objects, SiteMaps
from refcntd.kernel.records import (
    AnomalyRecord,
    LifecycleEvent,
    ObjectRecord,
    ReleasedSite,
    StackRef,
    Totals,
    add_totals,
)
from refcntd.reach.scan import ReachScan, finish
from refcntd.symbolize.symbolizer import Symbolizer
from refcntd.symbolize.turn import SYMBOLIZE

REPORTED_KEEP = 4096  # far more than the reports one ring-buffer read can bring
PENDING_ARGV_LIMIT = 4096
UNKNOWN_OBJECT = (AnomalyKind.UNKNOWN_GET, AnomalyKind.UNKNOWN_PUT, AnomalyKind.UNKNOWN_DELETE)
PRUNE_STATS_EVERY = 64  # reports between sweeps of counters no report will take
Records = list[ObjectRecord] | ObjectColumns  # a process's objects: columns without history


@dataclass
class Session:
    tgid: int
    gen: int
    comm: str = ""
    command: list[str] = field(default_factory=list)
    parent: int = 0


class SessionTracker:
    def __init__(self, objects: Objects, site_maps: SiteMaps, stacks: StackSource,
                 symbolizer: Symbolizer, on_report: Callable[[ProcessReport], None],
                 proc_root: Path = Path("/proc"), clock_ns: Callable[[], int] | None = None,
                 submit: Callable[[Callable[[], None]], None] = lambda job: job()) -> None:
        self.objects, self.site_maps = objects, site_maps
        self.stacks, self.sym = stacks, symbolizer
        self.on_report = on_report
        self.submit = submit  # where reports are built: a ReportWorker's, or right here
        self.proc_root = proc_root
        self.clock_ns = clock_ns or (lambda: _monotonic_ns())
        self.sessions: dict[int, Session] = {}
        # operations of reported processes' objects the kernel could not name (SITES)
        self.unnamed_totals: dict[str, Totals] = {}
        self.totals_lock = threading.Lock()
        # (tgid, gen) of the latest reports, oldest first: a process is reported once;
        # bounded, as serve reports processes for months (gens never repeat)
        self.reported: dict[tuple[int, int], None] = {}
        self._argv: OrderedDict[int, list[str]] = OrderedDict()
        self._anomalies: dict[int, list[AnomalyRecord]] = {}
        self.exit_codes: dict[int, int] = {}  # filled by `run` from waitpid
        self.wait_status: Callable[[int], int | None] = lambda tgid: None
        self.stub_names: frozenset[str] | None = None  # set when history is on
        # --leak-kinds: the scan made when the process was held at _exit (exitscan.py)
        self.take_scan: Callable[[int], ReachScan | None] | None = None
        # processes running before the probes were attached: their gets and puts on
        # objects made before are counted by the kernel (one note), not each reported
        self.predating: set[int] = set()
        self._built = 0  # reports built (on the worker)

    # ---- events ------------------------------------------------------------
    def handle(self, ev: LifecycleEvent | AnomalyRecord) -> None:
        if isinstance(ev, AnomalyRecord):
            if ev.tgid not in self.predating or ev.anomaly not in UNKNOWN_OBJECT:
                self._anomalies.setdefault(ev.tgid, []).append(ev)
        elif ev.kind == EventKind.EXECVE:
            self._on_execve(ev)
        elif ev.kind in (EventKind.PROC, EventKind.FORK):
            self._on_new(ev)
        elif ev.kind == EventKind.THREAD_GONE:
            self.sessions.pop(ev.pid, None)
        elif ev.kind == EventKind.EXIT:
            self._on_exit(ev)

    def add_root(self, tgid: int, gen: int, command: list[str]) -> None:
        self.sessions[tgid] = Session(tgid, gen, Path(command[0]).name[:COMM_MAX], list(command))

    def running_processes(self) -> int:
        """Traced processes running: sessions of processes, not of their threads (the
        BPF side follows a traced process's clones, threads too)."""
        return sum(1 for tgid in list(self.sessions) if _tgid_of(tgid, self.proc_root) == tgid)

    def _on_execve(self, ev: LifecycleEvent) -> None:
        command = list(ev.argv) or [ev.path]
        session = self.sessions.get(ev.tgid)
        if session is not None:
            session.command = command
            # the kernel names an exec'd process after the file (a failed execve of a
            # PATH search names the same file elsewhere)
            session.comm = Path(ev.path).name[:COMM_MAX] or session.comm
            return
        self._argv[ev.tgid] = command
        while len(self._argv) > PENDING_ARGV_LIMIT:
            self._argv.popitem(last=False)

    def _on_new(self, ev: LifecycleEvent) -> None:
        if ev.kind == EventKind.FORK:
            parent = self.sessions.get(ev.pid)
            command = list(parent.command) if parent else []
            self.sessions[ev.tgid] = Session(ev.tgid, ev.gen, ev.comm, command, ev.pid)
            return
        command = self._argv.pop(ev.tgid, []) or self._read_cmdline(ev.tgid)
        # the process's name, not that of the thread whose init found it (audiotestsrc0:s)
        comm = read_comm(ev.tgid, self.proc_root) or ev.comm
        self.sessions[ev.tgid] = Session(ev.tgid, ev.gen, comm, command or [comm])

    def _read_cmdline(self, tgid: int) -> list[str]:
        return read_cmdline(tgid, self.proc_root)

    def _on_exit(self, ev: LifecycleEvent) -> None:
        session = self.sessions.pop(ev.tgid, None)
        if session is None or session.gen != ev.gen or (ev.tgid, ev.gen) in self.reported:
            return
        self.predating.discard(ev.tgid)
        if ev.pid == ev.tgid:  # else the last thread's name (gmain, pool-0), not the program's
            session.comm = ev.comm or session.comm
        session.comm = session.comm or ev.comm
        waited = self.exit_codes.get(ev.tgid)
        if ev.exit_code < 0 and waited is None:
            waited = self.wait_status(ev.tgid)
        status, code = _exit_status(ev.exit_code, waited)
        # drained on the worker: an exited process's records no longer change (they are
        # keyed by its generation), and a million of them take a second to read
        tgid, gen = ev.tgid, ev.gen
        if self.stub_names is None:  # drained as columns: with others waiting, in one walk
            self.objects.expect_exit(tgid, gen)
        self._report(session, STATE_EXITED, lambda: self._drain(tgid, gen), ev.ts, status,
                     code)

    def _drain(self, tgid: int, gen: int | None) -> Records:
        """Without history, as columns: a million objects are reported in seconds."""
        if self.stub_names is None:
            return self.objects.drain_columns(tgid, gen)
        return self.objects.drain(tgid, gen)

    # ---- end of tracing --------------------------------------------------------
    def finish(self) -> None:
        """At detach: live processes' objects as live, orphans as 'exit not seen'."""
        now = self.clock_ns()
        at_detach = set()
        for session in list(self.sessions.values()):
            alive = (self.proc_root / str(session.tgid)).exists()
            records = self._drain(session.tgid, session.gen)
            state = STATE_LIVE_AT_DETACH if alive else STATE_EXIT_NOT_SEEN
            if records or session.tgid in self._anomalies:
                self._report(session, state, _given(records), now, "", None)
                at_detach.add(session.tgid)
        self.sessions.clear()
        self.submit(lambda: self._orphans(now, at_detach))

    def _orphans(self, now: int, reported: set[int]) -> None:
        """On the worker, after every queued report has drained its process: objects
        left in the kernel belong to processes without a session.  A running process
        reported at this detach has its report: what it made while the probes were
        still attached after its drain goes with them, not into a second report."""
        orphans: dict[int, list[ObjectRecord]] = {}
        for rec in self.objects.live_objects():
            orphans.setdefault(rec.tgid, []).append(rec)
        for tgid in self._anomalies:
            orphans.setdefault(tgid, [])
        for tgid, records in orphans.items():
            self.objects.drain(tgid, None)
            if tgid in reported:
                self._anomalies.pop(tgid, None)
                continue
            alive = (self.proc_root / str(tgid)).exists()
            gen = records[0].gen if records else 0
            session = Session(tgid, gen, "", self._read_cmdline(tgid) if alive else [])
            self._build(self._job(session, STATE_LIVE_AT_DETACH if alive
                                  else STATE_EXIT_NOT_SEEN, _given(records), now, "", None))

    def _report(self, session: Session, state: str, records: Callable[[], Records], now: int,
                status: str, code: int | None) -> None:
        """Capture side: take what must be read now, hand the rest to the worker."""
        job = self._job(session, state, records, now, status, code)
        self.submit(lambda: self._build(job))

    def _job(self, session: Session, state: str, records: Callable[[], Records], now: int,
             status: str, code: int | None) -> ReportJob:
        self.reported[(session.tgid, session.gen)] = None
        if len(self.reported) > REPORTED_KEEP:
            del self.reported[next(iter(self.reported))]
        released = (tuple(self.objects.released_sites(session.tgid))
                    if self.stub_names is not None else None)
        scan = self.take_scan(session.tgid) if self.take_scan and state == STATE_EXITED \
            else None
        return ReportJob(replace(session, command=list(session.command)), state, records,
                         now, status, code, tuple(self._anomalies.pop(session.tgid, [])),
                         released, scan)

    def _build(self, job: ReportJob) -> None:
        """Worker side: symbolize and attribute, then free the stacks the report read.
        The symbolizing takes its turn (symbolize/turn.py): serve's targets share the
        modules; reading the kernel and the process's memory, and the report's files,
        do not wait for it."""
        s, records = job.session, job.records()
        if job.scan is not None:
            finish(job.scan)  # read while the process was held at _exit (exitscan.py)
        history = None
        if self.stub_names is not None and job.released is not None:
            history = HistoryContext(self.stub_names, list(job.released))
        with SYMBOLIZE:
            mods = ProcessModules(perf_map=self.sym.perf_map(s.tgid, self.proc_root))
            if isinstance(records, ObjectColumns):
                groups = group_columns(records, self.stacks, self.sym, job.now, mods)
            else:
                groups = group_leaks(records, self.stacks, self.sym, job.now, mods, history)
            notes = self.sym.take_notes(s.tgid)
            anomalies = anomaly_findings(list(job.anomalies), self.stacks, self.sym, mods)
            operations = operation_paths(self.stacks, self.sym, mods, history) \
                if history else {}
            unnamed = unnamed_operations(self.site_maps.take_sites(s.tgid, s.gen),
                                         self.stacks, self.sym, mods)
        if job.state == STATE_EXITED:
            groups, released = set_aside_released(groups)
            notes += [released] if released else []
        if job.scan is not None:
            groups = apply_classes(apply_kinds(groups, job.scan, job.now), job.scan.classes)
            decide_by_holders(groups)  # ties the counts left, settled by who holds what
            notes += job.scan.notes
        elif self.take_scan is not None and groups and job.state == STATE_EXITED:
            notes.append("leak kinds not scanned: the process left without libc's _exit "
                         "(killed, or a raw exit_group): every object alive is a leak")
        with self.totals_lock:
            for name, sums in unnamed.items():
                add_totals(self.unnamed_totals, name, sums)
        self.objects.forget_stacks(s.tgid, s.gen,
                                   _stack_refs(records, list(job.anomalies), history))
        own = self.objects.take_process_stats(s.tgid)
        self._built += 1
        if self._built % PRUNE_STATS_EVERY == 0:
            self.prune_stats()
        self.on_report(ProcessReport(s.tgid, s.comm, s.command, job.state, job.status,
                                     job.code, groups, anomalies, kernel_stats=own,
                                     notes=notes, operations=operations,
                                     direct_exit=job.scan is not None and job.scan.direct_exit))

    def prune_stats(self) -> None:
        """On the worker: drop the kernel's counters of processes no report will take;
        after every PRUNE_STATS_EVERY reports, and every minute (Tracer.poll)."""
        self.objects.prune_process_stats(self._may_be_reported)

    def _may_be_reported(self, tgid: int) -> bool:
        """A process whose report may still come (counters of the others are stale)."""
        return tgid in self.sessions or (self.proc_root / str(tgid)).exists()


@dataclass(frozen=True)
class ReportJob:
    """Everything a process's report needs, read from the kernel at its exit."""

    session: Session
    state: str
    records: Callable[[], Records]  # drains them: owned by this job alone
    now: int
    status: str
    code: int | None
    anomalies: tuple[AnomalyRecord, ...]
    released: tuple[ReleasedSite, ...] | None  # None: history is off
    scan: ReachScan | None = None  # --leak-kinds: taken at its _exit


def _given(records: Records) -> Callable[[], Records]:
    return lambda: records


def read_comm(pid: int, proc_root: Path = Path("/proc")) -> str:
    """A live process's name (its main thread's); empty once it is gone."""
    try:
        return (proc_root / str(pid) / "comm").read_text(errors="replace").rstrip("\n")
    except OSError:
        return ""


def _tgid_of(tid: int, proc_root: Path) -> int | None:
    """The process of thread `tid` (itself for a process); None once it is gone."""
    try:
        status = (proc_root / str(tid) / "status").read_text(errors="replace")
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    return None


def read_cmdline(pid: int, proc_root: Path = Path("/proc")) -> list[str]:
    """A live process's arguments; empty once it is gone."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _stack_refs(records: Records, anomalies: list[AnomalyRecord],
                history: HistoryContext | None) -> list[StackRef]:
    """Every stack a process's report used: the kernel may free them now."""
    if isinstance(records, ObjectColumns):  # no history: only allocation stacks
        refs = records.stack_refs()
        records = []
    else:
        refs = [StackRef(r.stack_id, r.caller_ip) for r in records]
    for r in records:
        if r.history:
            refs += [e.where for e in r.history.events] + [s.where for s in r.history.sites]
    for a in anomalies:
        refs += [a.where, *([a.alloc] if a.alloc else [])]
    if history:
        refs += [r.site.where for r in history.released]
    return refs


def _exit_status(kernel_code: int, waited: int | None) -> tuple[str, int | None]:
    """Wait-status style code (from the kernel or waitpid) as text and shell-style int."""
    raw = kernel_code if kernel_code >= 0 else waited
    if raw is None:
        return "", None
    if raw & 0x7F:
        sig = raw & 0x7F
        return f"killed by {_signal_name(sig)}", 128 + sig
    return f"exit {raw >> 8 & 0xFF}", raw >> 8 & 0xFF


def _signal_name(sig: int) -> str:
    import signal
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _monotonic_ns() -> int:
    """bpf_ktime_get_ns() is CLOCK_MONOTONIC."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)
