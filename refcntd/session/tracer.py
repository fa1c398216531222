"""The Tracer: plan -> kernel -> sessions -> reports, wired together for run (run.py),
attach (attach.py) and serve."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from refcntd import progress
from refcntd.analysis import kept
from refcntd.analysis.leaks import StackSource
from refcntd.analysis.model import (
    STATE_EXIT_NOT_SEEN,
    ProcessReport,
    RunResult,
    TracingStatus,
)
from refcntd.binary.plan import Plan
from refcntd.binary.probesite import ProbeSite
from refcntd.inputs.files import file_identity
from refcntd.inputs.rootpaths import resolve, seen_inside
from refcntd.inputs.spec import ClassSource
from refcntd.kernel.abi import FNV_OFFSET, FNV_PRIME, EventKind, Stat
from refcntd.kernel.decode import file_key, pack_probe_cfgs, process_path
from refcntd.kernel.loader import Kernel
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.kernel.program import KernelOptions
from refcntd.kernel.records import (
    AnomalyRecord,
    LifecycleEvent,
    Totals,
    add_totals,
)
from refcntd.kernel.typetable import TYPE_NAME_MAX
from refcntd.session.execscan import ExecScanner
from refcntd.session.exitscan import ExitScans
from refcntd.session.guardian import Guardian
from refcntd.session.lifecycle import SessionTracker
from refcntd.session.options import TraceOptions, kernel_options
from refcntd.session.status import (
    LOST_REASONS,
    NOTE_REASONS,
    probe_statuses,
    silent_roles,
    unprobed_copies,
)
from refcntd.session.typekeeper import TypeKeeper
from refcntd.session.unwind import UnwindTables, exec_mappings, prefetch
from refcntd.session.vetting import Vetting, continue_blocker, continue_orphans, with_holds
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
                 early: BackgroundCompile | None = None, keep_reports: bool = True) -> None:
        """`keep_reports`: every report stays in `reports` for finish()'s result (run,
        attach); serve, which hands each one to `on_report` and runs for months, keeps none."""
        self.plan = plan
        self.filtered = filtered
        self.reports: list[ProcessReport] = []
        self.loaded: set[str] = set()  # libraries ld.so reported loaded in traced processes
        self.execd: set[str] = set()  # programs traced processes exec'd
        self.ldso_watched = False  # ld.so's probe attached: `loaded` is every library loaded
        self._keep_reports = keep_reports
        self._exits_not_seen = 0  # reports whose process's exit was not seen
        self._on_report = on_report
        kopts = kernel_options(plan.spec, plan.ldso is not None, filtered, opts)
        # stopping a process is only safe when refcntd can continue it (CAP_KILL)
        kopts = with_holds(kopts, bool(plan.cross), opts.scan_execs and filtered)
        self._type_ids = _fixed_type_ids(plan)
        # read while the early compile may still be running: the main thread would wait
        self._packed = pack_probe_cfgs(plan.sites, self._type_ids.__getitem__)
        ready = prefetch(plan.modules) if kopts.unwind_offsets is not None else None
        self.kernel = _load_kernel(kopts, plan, early)
        self.exec_scanner = ExecScanner(plan.spec, plan.probe_modes, self.kernel.probes,
                                        self._type_ids.__getitem__, self._probed_at_exec) \
            if kopts.hold_execs else None
        self.vetting = Vetting(self.kernel.probes, self.kernel.holds, plan,
                               self._type_ids.__getitem__, self._more_call_sites,
                               self._load_tables if kopts.hold_tables else None,
                               self.exec_scanner.scan if self.exec_scanner else None)
        # a process stopped by the BPF side is continued even if refcntd is SIGKILLed
        self.guardian = Guardian(self.kernel.holds.held_map_fd()) if self.kernel.holds.enabled \
            else None
        for tgid in continue_orphans():
            plan.notes.append(f"process {tgid} was left stopped by a refcntd that died while "
                              "it scanned a module the process mapped: continued")
        self.unwind = UnwindTables(self.kernel.unwind, ready)
        with progress.stage("unwind tables"):
            self.unwind.add(plan.modules)
        planned = [k for k in map(file_key, plan.modules) if k is not None]
        self.kernel.holds.own_tables(planned)
        if self.exec_scanner is not None:  # probed already: exec'ing them stops nobody
            self.kernel.holds.vet([k for k in planned if self.vetting.accounted(k)])
            self.exec_scanner.seen(planned)
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
        self.programs = self._scope(opts.programs)
        self.exit_scans = self._exit_scans(opts.leak_kinds)
        if opts.history is not None:
            self.tracker.stub_names = frozenset(
                f for role in plan.spec.entries for f in role.functions)
            if opts.history != ("all",):
                self.kernel.set_history_types([type_id(n) for n in opts.history])

    def _scope(self, programs: tuple[str, ...]) -> frozenset[tuple[int, int]] | None:
        """System-wide, only the processes running `programs` (serve: a target whose
        path is a program, on a spec probing a library every process maps); the
        programs' (dev, inode), or None when every process mapping the probes counts."""
        if not programs:
            return None
        if not self.kernel.opts.exe_filter or self.kernel.opts.unwind_offsets is None:
            self.plan.notes.append("every process mapping a probed module is traced, not "
                                   f"only {', '.join(programs)}: the kernel's BTF lacks "
                                   "the offsets that read a process's executable")
            return None
        for path in self.kernel.set_exe_filter(programs):
            self.plan.notes.append(f"{path}: no such file when the probes were attached")
        return frozenset((k.dev, k.ino) for k in map(file_key, programs) if k is not None)

    def _exit_scans(self, wanted: bool) -> ExitScans | None:
        """--leak-kinds: processes held at _exit (run and --pid; serve where a target
        is a program, whose processes alone the kernel side tracks: system-wide it
        would stop every process on the host); a note when it cannot be."""
        if not wanted:
            return None
        why = "" if self.filtered or self.programs is not None else \
            "only for a command (run), --pid or a serve target that is a program, " \
            "not system-wide"
        why = why or ("" if self.kernel.holds.enabled else
                      continue_blocker() or "the kernel side cannot hold processes here "
                      "(no BTF offsets for the unwinder, or REFCNTD_UNWIND=fp)")
        scans = ExitScans(self.kernel.probes, self.plan.binary, self._classed(),
                          self.kernel.objects.set_aside)
        if why:
            scans.problem = why
            self.plan.notes += scans.notes()
            return None
        self.vetting.exit_hold = scans.held
        self.tracker.take_scan = scans.take
        return scans

    def _classed(self) -> Callable[[int], dict[int, ClassSource]] | None:
        """The spec's `class:` types: a process's live objects of them, by address."""
        sources = {type_id(name): source
                   for name, source in self.plan.spec.class_sources().items()}
        if not sources:
            return None
        wanted = frozenset(sources)

        def classed(tgid: int) -> dict[int, ClassSource]:
            return {addr: sources[tid]
                    for addr, tid in self.kernel.objects.addresses_of(tgid, wanted)}
        return classed

    def __enter__(self) -> Tracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Detach, continuing every process held stopped: the probes go first, so no
        process can be stopped after the held map is read; then the maps."""
        self.worker.stop()  # its jobs read kernel maps: detach only after them
        self.kernel.detach(self.vetting.continue_all)
        if self.guardian is not None:
            self.guardian.close()

    def start(self) -> None:
        self.type_keeper.set_fixed()
        with progress.stage("probe configuration"):
            self.kernel.probes.configure(self._type_ids.__getitem__, self._packed)
        self.kernel.open_events(self._on_event)
        with progress.stage("probe creation"):
            self.kernel.probes.attach_all()
            self.attached_at = time.time()
            self.vetting.start()
            if self.exit_scans is not None:
                self.exit_scans.attach()
            why = self.plan.ldso and self.kernel.probes.attach_ldso(self.plan.ldso.path,
                                                                    self.plan.ldso.sites)
        self.ldso_watched = self.plan.ldso is not None and not why
        if why:
            self.plan.notes.append(f"ld.so probe not installed ({why}): frames in "
                                   "libraries unloaded before exit may stay unresolved")

    def _load_tables(self, tgid: int) -> None:
        """A process stopped before a probed module of its runs: its unwind tables."""
        self.unwind.load_for_process(tgid)

    def _probed_at_exec(self, path: str, sites: list[ProbeSite]) -> None:
        """A program the traced tree exec'd has its own copy of the functions, probed now:
        its stacks are symbolized as the command's are."""
        self._more_call_sites(sites)
        self.index.add(path)

    def _more_call_sites(self, sites: list[ProbeSite]) -> None:
        """Probes added for a module mapped later: their stacks read like entry probes'."""
        # one dict update (atomic under the GIL): the held process must not wait for
        # the report worker's queue
        self.tracker.sym.call_sites.update(call_site_frames(sites))

    def adopt_running(self) -> None:
        """System-wide: processes already mapping a probed module get their mappings
        seeded (stacks) and the modules they map scanned (exported call-site mode)."""
        for tgid in _processes_mapping(self.plan.modules, self.programs):
            self.tracker.predating.add(tgid)
            self.unwind.seed_process(tgid)
            self.vetting.vet_process(tgid)

    def _on_event(self, ev: LifecycleEvent | AnomalyRecord) -> None:
        if isinstance(ev, AnomalyRecord):
            self.tracker.handle(ev)
            return
        if ev.kind == EventKind.HOLD:
            self.vetting.handle_held()
            return
        if ev.kind in (EventKind.LIBRARY, EventKind.EXECVE):  # /proc/self/fd/N: the process's
            ev = replace(ev, path=process_path(ev.path, ev.tgid))
        if ev.kind == EventKind.LIBRARY:
            self.loaded.add(ev.path)
            self.index.add_library(ev.path, ev.tgid)
            self.unwind.add([ev.path])
            return
        if ev.kind == EventKind.EXECVE:
            self.index.watch_process(ev.tgid)  # it may have entered a container
            self.execd.add(ev.path)
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
        self._exits_not_seen += report.state == STATE_EXIT_NOT_SEEN
        if self._keep_reports:
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
        if time.monotonic() >= self._next_age_prune:
            self._next_age_prune = time.monotonic() + PRUNE_AGE_BINS_EVERY_S
            if self.kernel.opts.sites:  # bins no longer needed go, scraped or not
                self.worker.submit(self._prune_age_bins)
            # counters of untraced or unreported processes (a tracer whose program is a
            # long-running service reports rarely: its sweep after reports never came)
            self.worker.submit(self.tracker.prune_stats)
            self.index.forget_gone()  # here: the roots are the capture thread's

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
        unseen = self._exits_not_seen
        if unseen and own is None:
            lost["processes whose exit was not seen (objects drained at detach)"] = unseen
        notes = [f"{stats[stat]} {text}" for stat, text in NOTE_REASONS.items() if stats[stat]]
        notes += silent_roles(self.plan, hits, self.loaded | self.execd)
        if own is None:
            lost.update(unprobed_copies(self.plan, hits, self.loaded))
        notes += self.kernel.notes() + self.kernel.probes.notes()
        notes += self.exit_scans.notes() if self.exit_scans is not None else []
        notes += self.tracker.sym.notes()  # debug files and debuginfod refused for the run
        if own is None:  # other processes' stops and modules: not one process's report
            notes += self.vetting.notes()
            notes += [f"no unwind table for {f}" for f in self.unwind.failed]
            notes += [f"unwind table not loaded (table space full): {p}"
                      for p in self.kernel.unwind.not_loaded]
        scanner = self.exec_scanner
        if scanner is not None and own is None:
            notes += scanner.notes() + scanner.problems
            if scanner.problems:
                lost["programs exec'd with the spec's functions that could not all be probed "
                     "(the notes say which)"] = len(scanner.problems)
        if self.plan.deferred and own is None and not (scanner and scanner.probed):
            lost[f"no program the command ran had the spec's functions "
                 f"({', '.join(self.plan.deferred)})"] = 1
        cut = sum(stats[s] for s in (Stat.TRUNC_NO_TABLE, Stat.TRUNC_UNREADABLE,
                                     Stat.TRUNC_DEPTH, Stat.TRUNC_OUTSIDE, Stat.TRUNC_BAD_RULE))
        return TracingStatus(probes, lost, notes + list(self.plan.notes), cut)


def _processes_mapping(modules: Iterable[str],
                       programs: frozenset[tuple[int, int]] | None = None) -> list[int]:
    """Running processes that map one of `modules` (their stacks need seeded mappings),
    and run one of `programs` ((dev, inode)) when given.  A module named through another
    root (/proc/PID/root/...) is mapped under the name its processes see."""
    names = {seen_inside(resolve(m)) for m in modules}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and names & {m[0] for m in exec_mappings(entry / "maps")} \
                and (programs is None or _runs(entry, programs)):
            found.append(int(entry.name))
    return found


def _runs(proc: Path, programs: frozenset[tuple[int, int]]) -> bool:
    """Whether the process at /proc/PID runs one of `programs`."""
    key = file_key(str(proc / "exe"))
    return key is not None and (key.dev, key.ino) in programs
