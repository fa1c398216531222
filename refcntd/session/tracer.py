"""Run and attach: wire plan -> kernel -> sessions -> reports together."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from types import FrameType

from refcntd import progress
from refcntd.analysis import kept
from refcntd.analysis.leaks import StackSource
from refcntd.analysis.model import (
    STATE_EXIT_NOT_SEEN,
    ProbeStatus,
    ProcessReport,
    RunResult,
    TracingStatus,
)
from refcntd.binary.plan import Plan, ProbeSite
from refcntd.inputs.files import file_identity
from refcntd.inputs.spec import RoleSpec
from refcntd.kernel.abi import FNV_OFFSET, FNV_PRIME, STAT_TEXT, EventKind, Stat
from refcntd.kernel.decode import pack_probe_cfgs
from refcntd.kernel.loader import Kernel
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.kernel.procctl import die_with_parent
from refcntd.kernel.program import KernelOptions
from refcntd.kernel.records import (
    AnomalyRecord,
    LifecycleEvent,
    ProbeFailure,
    Totals,
    add_totals,
)
from refcntd.kernel.typetable import TYPE_NAME_MAX
from refcntd.session.lifecycle import SessionTracker, read_cmdline
from refcntd.session.options import TraceOptions, kernel_options
from refcntd.session.typekeeper import TypeKeeper
from refcntd.session.unwind import UnwindTables, command_path, exec_mappings, prefetch
from refcntd.session.vetting import Vetting, continue_orphans
from refcntd.session.worker import ReportWorker
from refcntd.symbolize.symbolizer import (
    BuildIdIndex,
    CallSiteFrame,
    FileId,
    Symbolizer,
)

POLL_MS = 100
PRUNE_AGE_BINS_EVERY_S = 60.0  # a fine bin stops being needed ten minutes after its second
PRUNE_TYPES_EVERY_S = 2.0  # how often the type table's fill is looked at

# What each kernel counter means for the report, from bpf/refcntd.h: a "loss"
# makes a run incomplete, a "note" is shown.
LOST_REASONS = {stat: text.removeprefix("loss: ") for stat, text in STAT_TEXT.items()
                if text.startswith("loss: ")}
NOTE_REASONS = {stat: text.removeprefix("note: ") for stat, text in STAT_TEXT.items()
                if text.startswith("note: ")}


def call_site_frames(sites: list[ProbeSite]) -> dict[tuple[FileId, int], CallSiteFrame]:
    """Call-site probes whose stacks the report shows as the callee's entry probe's."""
    ids = {m: file_identity(m) for m in {s.module for s in sites}}
    return {(ids[s.module], s.symbol_vaddr + s.probe_offset):
            CallSiteFrame(s.site_kind, s.symbol_vaddr, s.site_length, s.callee_module)
            for s in sites if s.site_kind in ("call", "jmp")}


def type_id(name: str) -> int:
    """The id bpf/refcntd.c:intern_type gives a type name (FNV-1a, low bit set)."""
    return _fnv1a(name.encode()[:TYPE_NAME_MAX]) | 1


def _fixed_type_ids(plan: Plan) -> dict[str, int]:
    return {name: type_id(name) for name in sorted(plan.spec.constant_types())}


def _fnv1a(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return h


def _load_kernel(kopts: KernelOptions, plan: Plan, early: BackgroundCompile | None) -> Kernel:
    """The kernel side, from the program compiled during the analysis when it fits."""
    program = None
    if early is not None:
        with progress.stage("BPF compile (started before the analysis)"):
            program, waited = early.take(kopts, len(plan.sites))
        if program is not None:
            progress.note(f"{program.how}: {early.seconds:.2f} s, during the binary analysis "
                          f"(waited {waited:.2f} s for it after)")
        else:
            progress.note("BPF compile: the early compile did not fit the plan; compiling again")
    with progress.stage("BPF compile and load" if program is None else "BPF load"):
        return Kernel(kopts, plan.sites, program)


class Tracer:
    """A loaded, attached kernel plus the session tracker reading its events."""

    def __init__(self, plan: Plan, filtered: bool, opts: TraceOptions,
                 on_report: Callable[[ProcessReport], None],
                 early: BackgroundCompile | None = None) -> None:
        self.plan = plan
        self.filtered = filtered
        self.reports: list[ProcessReport] = []
        self._on_report = on_report
        kopts = kernel_options(plan.spec, plan.loader is not None, filtered, opts)
        kopts = replace(kopts, hold=bool(plan.cross))
        self._type_ids = _fixed_type_ids(plan)
        # read while the early compile may still be running: the main thread would wait
        self._packed = pack_probe_cfgs(plan.sites, self._type_ids.__getitem__)
        ready = prefetch(plan.modules) if kopts.unwind_offsets is not None else None
        self.kernel = _load_kernel(kopts, plan, early)
        self.vetting = Vetting(self.kernel.probes, self.kernel.holds, plan,
                               self._type_ids.__getitem__, self._more_call_sites)
        for tgid in continue_orphans():
            plan.notes.append(f"process {tgid} was left stopped by a refcntd that died while "
                              "it scanned a module the process mapped: continued")
        self.unwind = UnwindTables(self.kernel.unwind, ready)
        with progress.stage("unwind tables"):
            self.unwind.add(plan.modules)
        self.index = BuildIdIndex()
        for module in plan.modules:
            self.index.add(module)
        stacks = StackSource(self.kernel.objects.stack_record)
        sym = Symbolizer(self.index, call_site_frames(plan.sites))
        self.worker = ReportWorker()
        self.type_keeper = TypeKeeper(self.kernel.types, kopts.max_types, self._type_ids)
        self._next_prune = time.monotonic() + PRUNE_TYPES_EVERY_S
        self._next_age_prune = time.monotonic() + PRUNE_AGE_BINS_EVERY_S
        self.attached_at = 0.0  # time.time() when the probes were attached
        self.tracker = SessionTracker(self.kernel.objects, self.kernel.site_maps, stacks, sym,
                                      self._report,
                                      submit=self.worker.submit)
        if opts.comm_filter:
            self.kernel.set_comm_filter(opts.comm_filter)
        if opts.history is not None:
            self.tracker.stub_names = frozenset(
                f for role in plan.spec.entries for f in role.functions)
            if opts.history != ("all",):
                self.kernel.set_history_types([type_id(n) for n in opts.history])

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()  # its jobs read kernel maps: detach only after them
        self.vetting.continue_all()
        self.kernel.detach()

    def start(self) -> None:
        self.type_keeper.set_fixed()
        with progress.stage("probe configuration"):
            self.kernel.probes.configure(self._type_ids.__getitem__, self._packed)
        self.kernel.open_events(self._on_event)
        with progress.stage("probe creation"):
            self.kernel.probes.attach_all()
            self.attached_at = time.time()
            self.vetting.start()
            why = self.plan.loader and self.kernel.probes.attach_ldso(self.plan.loader.path,
                                                                      self.plan.loader.sites)
        if why:
            self.plan.notes.append(f"ld.so probe not installed ({why}): frames in "
                                   "libraries unloaded before exit may stay unresolved")

    def _more_call_sites(self, sites: list[ProbeSite]) -> None:
        """Probes added for a module mapped later: their stacks read like entry probes'."""
        # one dict update (atomic under the GIL): the held process must not wait for
        # the report worker's queue
        self.tracker.sym.call_sites.update(call_site_frames(sites))

    def adopt_running(self) -> None:
        """System-wide: processes already mapping a probed module get their mappings
        seeded (stacks) and the modules they map scanned (exported call-site mode)."""
        for tgid in _processes_mapping(self.plan.modules):
            self.unwind.seed_process(tgid)
            self.vetting.vet_process(tgid)

    def _on_event(self, ev: LifecycleEvent | AnomalyRecord) -> None:
        if isinstance(ev, AnomalyRecord):
            self.tracker.handle(ev)
            return
        if ev.kind == EventKind.HOLD:
            self.vetting.handle_held()
            return
        if ev.kind == EventKind.LIBRARY:
            self.index.add_library(ev.path, ev.tgid)
            self.unwind.add([ev.path])
            return
        if ev.kind == EventKind.EXECVE:
            self.index.watch_process(ev.tgid)  # it may have entered a container
        if ev.kind == EventKind.FORK:
            self.index.inherit_root(ev.tgid, ev.pid)
        if ev.kind == EventKind.EXECVE and ev.path.startswith("/") and self.filtered:
            self.index.add_library(ev.path, ev.tgid)  # system-wide, every exec would come here
            self.unwind.add([ev.path])
        if ev.kind in (EventKind.PROC, EventKind.FORK):
            self.index.add_process_maps(f"/proc/{ev.tgid}/maps")
        self.tracker.handle(ev)
        if ev.kind == EventKind.EXIT:
            self.index.forget_process(ev.tgid)

    def _report(self, report: ProcessReport) -> None:
        kept.set_aside(report, self.plan.spec.kept_by_library)
        self.reports.append(report)
        self._on_report(report)

    def poll(self, timeout_ms: int = POLL_MS) -> None:
        """Capture: read the ring buffer (exited processes are drained); nothing more."""
        self.kernel.poll(timeout_ms)
        self.vetting.handle_held()  # stops whose event was lost: nobody stays stopped
        self.worker.raise_error()
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_TYPES_EVERY_S
            self.worker.submit(self.type_keeper.prune)
        if self.kernel.opts.sites and time.monotonic() >= self._next_age_prune:
            # creation-time bins no longer needed go, scraped or not (attach never is)
            self._next_age_prune = time.monotonic() + PRUNE_AGE_BINS_EVERY_S
            self.worker.submit(self._prune_age_bins)

    def _prune_age_bins(self) -> None:
        """On the worker: reading the age bins removes those no longer needed."""
        self.kernel.site_maps.age_bins(time.clock_gettime_ns(time.CLOCK_MONOTONIC))

    def released_totals(self) -> dict[str, Totals]:
        """Per type name, (inits, gets, puts, releases) of released objects (every
        operation with SITES): the kernel's totals plus those of types pruned from its
        table and, with SITES, of reported processes' objects the kernel could not name
        (counters never go down)."""
        out = self.type_keeper.released_totals()
        with self.tracker.totals_lock:
            for name, sums in self.tracker.unnamed_totals.items():
                add_totals(out, name, sums)
        return out

    def finish(self, result: RunResult) -> RunResult:
        self.kernel.poll(0)
        self.tracker.finish()
        self.worker.close()  # every report built before the status is read
        result.processes = list(self.reports)
        result.tracing = self.tracing_status()
        return result

    def tracing_status(self, own: dict[Stat, int] | None = None) -> TracingStatus:
        """The tracer's status; with `own` (one process's counters), that process's
        losses and notes instead of the totals of every process traced so far."""
        hits = self.kernel.probes.hits()
        probes = probe_statuses(self.plan, self.kernel.probes.failed_probes, hits)
        stats = self.kernel.stats() if own is None else {s: own.get(s, 0) for s in Stat}
        lost = {text: stats[stat] for stat, text in LOST_REASONS.items() if stats[stat]}
        lost.update(self.plan.scan_gaps)  # DWARF not examined for inlined copies
        if self.kernel.objects.stacks_freed_early and own is None:
            lost["allocation stacks freed with another process that shared them"] = \
                self.kernel.objects.stacks_freed_early
        unseen = sum(1 for r in self.reports if r.state == STATE_EXIT_NOT_SEEN)
        if unseen and own is None:
            lost["processes whose exit was not seen (objects drained at detach)"] = unseen
        notes = [f"{stats[stat]} {text}" for stat, text in NOTE_REASONS.items() if stats[stat]]
        notes += silent_roles(self.plan, hits)
        notes += self.kernel.probes.notes()
        notes += self.vetting.notes()
        notes += [f"no unwind table for {f}" for f in self.unwind.failed]
        notes += [f"unwind table not loaded (table space full): {p}"
                  for p in self.kernel.unwind.not_loaded]
        return TracingStatus(probes, lost, notes + list(self.plan.notes))


def silent_roles(plan: Plan, hits: list[int]) -> list[str]:
    """Spec entries none of whose probes fired: wrong functions, or callers that
    bypass them (inlined, a private alias) - or a run that never needed them."""
    def key(entry: RoleSpec) -> tuple[str, tuple[str, ...], str | None]:
        return entry.role, entry.functions, entry.usdt  # a gcc clone's entry is remapped
    fired: dict[tuple[str, tuple[str, ...], str | None], int] = {}
    for site, n in zip(plan.sites, hits, strict=True):
        fired[key(site.spec_role)] = fired.get(key(site.spec_role), 0) + n
    return [f"{entry.role} role never fired in this run: "
            f"{entry.usdt or ', '.join(entry.functions)} (check the spec against the library)"
            for entry in plan.spec.entries if fired.get(key(entry)) == 0]


def probe_statuses(plan: Plan, failures: Iterable[ProbeFailure],
                   hits: list[int] | None = None) -> list[ProbeStatus]:
    """One status per entry probe, and one per function for all of its call sites; a
    failure names its site by index, never by text."""
    failed = {f.site_index: f for f in failures}
    hits = hits if hits is not None else [-1] * len(plan.sites)
    out: dict[tuple[str, str, str, int], ProbeStatus] = {}
    for i, (s, n) in enumerate(zip(plan.sites, hits, strict=True)):
        failure = failed.get(i)
        error = f"{failure.stage} failed: {failure.message}" if failure else ""
        key = (s.role, s.function, s.module, i if s.mode == "entry" else -1)
        old = out.get(key)
        if old is None:
            reason = next((d.reason for d in plan.decisions if (d.role, d.function, d.module)
                           == key[:3] and d.mode == s.mode), s.reason) if s.mode != "entry" \
                else s.reason
            out[key] = ProbeStatus(s.role, s.function, s.module, s.probe_offset, s.cost, reason,
                                   not error, error, s.mode, 1, n)
            continue
        worst = s.cost if s.cost == "single-step" else old.cost
        out[key] = replace(old, cost=worst, installed=old.installed and not error,
                           error=old.error or error, sites=old.sites + 1,
                           hits=old.hits + n)
    return list(out.values())


# ---- run ------------------------------------------------------------------------
def run_command(plan: Plan, command: list[str], opts: TraceOptions,
                on_report: Callable[[ProcessReport], None],
                early: BackgroundCompile | None = None) -> RunResult:
    """Start `command` gated, register it, release it, trace it and its descendants."""
    result = RunResult("run", plan.spec.name, command[0])
    with Tracer(plan, filtered=True, opts=opts, on_report=on_report, early=early) as tracer:
        tracer.start()
        tracer.unwind.add([p for p in [command_path(command)] if p])
        with progress.stage("per-process setup"):
            child = Child(command)
            root_gen = tracer.kernel.register_process(child.pid)
            tracer.tracker.add_root(child.pid, root_gen, command)
        tracer.tracker.wait_status = lambda tgid: _wait_root(child, tgid)
        child.release()
        with _forward_signals(child):
            _trace_until_done(tracer, child, opts.descendant_grace_s)
        result.command_status = _shell_status(child.wait(30.0))
        return tracer.finish(result)


class Child:
    """The command started by `run`: forked, held at a gate until traced, then exec'd."""

    def __init__(self, command: list[str]) -> None:
        read_end, write_end = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - replaced by exec
            _exec_after_gate(command, read_end, write_end, parent)
        os.close(read_end)
        self._gate = write_end
        self.status: int | None = None  # wait status once reaped

    def release(self) -> None:
        os.write(self._gate, b"x")
        os.close(self._gate)

    def poll(self) -> int | None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = status
        return self.status

    def wait(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.status

    def send_signal(self, signum: int) -> None:
        if self.status is None:
            os.kill(self.pid, signum)


def _exec_after_gate(command: list[str], read_end: int, write_end: int, parent: int) -> None:
    try:
        die_with_parent(parent)  # a SIGKILLed refcntd must not leave CMD running
        os.close(write_end)
        os.read(read_end, 1)
        os.close(read_end)
        os.execvp(command[0], command)
    except OSError as err:
        os.write(2, f"refcntd: cannot run {command[0]}: {err.strerror}\n".encode())
    finally:
        os._exit(127)


def _wait_root(child: Child, tgid: int) -> int | None:
    return child.wait(5.0) if tgid == child.pid else None


def _shell_status(status: int | None) -> int | None:
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _trace_until_done(tracer: Tracer, child: Child, grace_s: float) -> None:
    deadline = None
    while True:
        tracer.poll()
        if child.poll() is None:
            continue
        tracer.poll(0)
        alive = [t for t in tracer.tracker.sessions if Path(f"/proc/{t}").exists()]
        if not alive:
            return
        deadline = deadline or time.monotonic() + grace_s
        if time.monotonic() > deadline:
            return


class _forward_signals:
    """SIGINT/SIGTERM to refcntd go to the command; refcntd keeps tracing it to its end."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self.saved: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def __enter__(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.saved[sig] = signal.signal(sig, self._forward)

    def _forward(self, signum: int, _frame: object) -> None:
        self.child.send_signal(signum)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


# ---- attach ------------------------------------------------------------------------
class _StopFlag:
    def __init__(self) -> None:
        self.stop = False

    def __call__(self, _signum: int, _frame: object) -> None:
        self.stop = True


def attach(plan: Plan, pid: int | None, opts: TraceOptions,
           on_report: Callable[[ProcessReport], None],
           ready: Callable[[], None] = lambda: None,
           early: BackgroundCompile | None = None,
           started: Callable[[Tracer], Callable[[], None]] | None = None) -> RunResult:
    """Trace until SIGINT/SIGTERM; system-wide, or `pid` and its descendants.
    `started(tracer)`, once attached, returns what to run between polls (on this
    thread: what a signal asked for)."""
    result = RunResult("attach", plan.spec.name, plan.sites[0].module if plan.sites else "")
    flag = _StopFlag()
    saved = {s: signal.signal(s, flag) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with Tracer(plan, filtered=pid is not None, opts=opts, on_report=on_report,
                    early=early) as tracer:
            tracer.start()
            with progress.stage("per-process setup"):
                for tgid in _process_tree(pid) if pid is not None else []:
                    gen = tracer.kernel.register_process(tgid)
                    tracer.tracker.add_root(tgid, gen, read_cmdline(tgid) or [str(tgid)])
                    tracer.index.add_process_maps(f"/proc/{tgid}/maps")
                    tracer.unwind.seed_process(tgid)
                    tracer.vetting.vet_process(tgid)
                if pid is None:
                    tracer.adopt_running()
            tick = started(tracer) if started is not None else (lambda: None)
            ready()
            while not flag.stop and not (pid is not None and _tree_gone(tracer)):
                tracer.poll()
                tick()
            return tracer.finish(result)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _tree_gone(tracer: Tracer) -> bool:
    """attach --pid: the process and every descendant seen so far have exited (pending
    events are read first, so that a child forked just before its parent's exit counts)."""
    if any(Path(f"/proc/{t}").exists() for t in tracer.tracker.sessions):
        return False
    tracer.kernel.poll(0)
    if any(Path(f"/proc/{t}").exists() for t in tracer.tracker.sessions):
        return False
    progress.note("the traced process and its descendants have exited; detaching")
    return True


def _processes_mapping(modules: Iterable[str]) -> list[int]:
    """Running processes that map one of `modules` (their stacks need seeded mappings)."""
    names = {str(Path(m).resolve()) for m in modules}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and names & {m[0] for m in exec_mappings(entry / "maps")}:
            found.append(int(entry.name))
    return found


def _process_tree(root: int) -> list[int]:
    """`root` and its living descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out

