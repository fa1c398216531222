"""`refcntd serve`: trace configured programs continuously, export metrics,
write a report for every exiting traced process.

One Tracer (one BPF program) per binary a target's path matches (targets.py),
so a reload can add and remove targets without touching the others' counts.
The daemon runs the capture loop, reloads, checkpoints, reports and metrics;
systemd.py tells systemd, procconnector.py reports new programs.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Iterator

from refcntd.analysis.model import (
    STATE_EXITED,
    STATE_LIVE_AT_DETACH,
    LeakGroup,
    ProcessReport,
    RunResult,
)
from refcntd.errors import RefcntdError
from refcntd.inputs.config import Config, load_config
from refcntd.outputs import report, reportjson
from refcntd.outputs.reportstore import ReportStore
from refcntd.reach.scan import LATE, REACHABLE
from refcntd.service import checkpoint, malloc
from refcntd.service.classmetrics import UNREAD
from refcntd.service.gcpauses import Freezer, GcPauses
from refcntd.service.metrics import RefcntdCollector, TargetStats
from refcntd.service.procconnector import ProcConnector
from refcntd.service.scrapeclock import ScrapeClock
from refcntd.service.sharedlock import SharedLock
from refcntd.service.systemd import sd_notify
from refcntd.service.targets import TargetRuntime, Targets
from refcntd.session.tracer import Tracer

log = logging.getLogger("refcntd")
IDLE_S = 0.05
WATCH_EVERY_S = 1.0  # how often target paths are checked for new, replaced or removed files
RETENTION_EVERY_S = 60.0  # old reports are pruned on a timer, not only on the next write


class Daemon:
    def __init__(self, config: Config, strict: bool = False) -> None:
        malloc.limit_arenas()  # before the threads: months of RSS in freed arenas otherwise
        self.config = config
        self.strict = strict
        self.store = ReportStore(config.report_dir, config.retention)
        # target changes hold it alone; scrapes, /status and the views share it
        self.lock = SharedLock()
        self.stop = False
        self.reload_requested = False
        self._proc_events = ProcConnector()
        self.started = time.time()
        self.targets = Targets(self._on_report, self._adopt, strict, self.lock.released)
        self.views = checkpoint.Views(self.targets.tracers, self.lock.shared,
                                      config.web.show_cmdline)
        self._diff_requested = False
        self._next_prune = 0.0
        self._next_watch = 0.0
        self._pending_execs: list[tuple[int, str]] = []
        self.gc_pauses = GcPauses()  # a Prometheus collector: what the collector costs
        self.gc_pauses.install()
        self.scrapes = ScrapeClock()  # when HTTP readers are due: fed by the HTTP server
        self.freezer = Freezer(self.gc_pauses, self.scrapes)
        self._frozen_at = (0, 0)  # (attached, detached) told to the freezer

    # ---- lifecycle -----------------------------------------------------------
    def attach_all(self) -> None:
        for target in self.config.targets:
            self.targets.add(target)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGUSR1, lambda _s, _f: self.mark())
        signal.signal(signal.SIGUSR2, self._on_usr2)
        sd_notify("READY=1")
        log.info("serving %d target(s)", len(self.targets.runtimes))
        try:
            while not self.stop:
                self._round()
        finally:  # also on an error: every held process is continued at detach
            sd_notify("STOPPING=1")
            self.shutdown()

    def _round(self) -> None:
        self._capture()
        self._pending_execs += self._proc_events.execs(IDLE_S)
        # the report files and malloc's free pages: nothing readers of the targets use,
        # so no scrape waits for it (listing and pruning 5 000 reports, trimming the heap)
        self._prune_on_timer()
        if self.lock.acquire(blocking=False):  # else scrapes or diffs read the targets
            try:
                self._manage()
            finally:
                self.lock.release()
        self._refreeze_on_change()

    def _capture(self) -> None:
        """Only this thread changes the set of targets, so reading it needs no lock, and
        a scrape (which holds the lock) never delays the ring buffers.  A method of its
        own: a detached tracer left in a loop variable would outlive the refreeze."""
        for runtime in list(self.targets.runtimes.values()):
            for tracer in list(runtime.tracers.values()):
                self._poll(runtime, tracer)

    def _refreeze_on_change(self) -> None:
        """A detach's tracer is collected (a full refreeze); an attach's new objects
        frozen (gcpauses.py), at the Freezer's next quiet moment."""
        changes = (self.targets.attached, self.targets.detached)
        if changes != self._frozen_at:
            self.freezer.full_due |= changes[1] != self._frozen_at[1]
            self.freezer.young_due = True
            self._frozen_at = changes
        self.freezer.tick()

    def _poll(self, runtime: TargetRuntime, tracer: Tracer) -> None:
        """A report that failed to build is a bug: logged and counted, and the daemon
        goes on tracing (its other processes' reports are built)."""
        try:
            tracer.poll(0)
        except Exception as err:  # noqa: BLE001 - raised by the report worker
            self.store.stats.errors += 1
            log.error("target=%s a report could not be built (a refcntd bug): %s: %s",
                      runtime.target.name, type(err).__name__, err)

    def _manage(self) -> None:
        """Target changes (new, replaced or removed binaries, SIGHUP), under the lock."""
        execs, self._pending_execs = self._pending_execs, []
        for tgid, exe in execs:
            self._on_exec(tgid, exe)
        if self.reload_requested:
            self.reload_requested = False
            self.reload()
        self._watch_on_timer()
        if self._diff_requested:
            self._diff_requested = False
            self._write_diff()

    # ---- checkpoints -----------------------------------------------------------
    def mark(self) -> checkpoint.Checkpoint:
        """A checkpoint for every target (SIGUSR1, POST /checkpoint)."""
        return self.views.mark()

    def _on_usr2(self, _sig: int, _frame: object) -> None:
        self._diff_requested = True  # written by the main loop, not in the handler

    def _adopt(self, tracer: Tracer) -> None:
        self.views.adopt(tracer)

    def _write_diff(self) -> None:
        try:
            path = self.store.write("diff", os.getpid(),
                                    self.views.json(True),  # type: ignore[arg-type]
                                    self.views.text(True))
            log.info("diff since the checkpoint written to %s", path)
        except OSError as err:
            log.error("diff not written to %s: %s", self.store.dir, err.strerror)

    def _watch_on_timer(self) -> None:
        now = time.monotonic()
        if now < self._next_watch:
            return
        self._next_watch = now + WATCH_EVERY_S
        with self.lock:
            for runtime in list(self.targets.runtimes.values()):
                self.targets.follow(runtime)

    def _prune_on_timer(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + RETENTION_EVERY_S
        malloc.trim()
        try:
            self.store.prune()
        except OSError as err:
            log.error("pruning reports in %s failed: %s", self.store.dir, err.strerror)

    def _on_stop(self, _sig: int, _frame: object) -> None:
        self.stop = True

    def _on_hup(self, _sig: int, _frame: object) -> None:
        self.reload_requested = True

    def shutdown(self) -> None:
        with self.lock:
            for name in list(self.targets.runtimes):
                self.targets.remove(name)
        self._proc_events.close()
        self.gc_pauses.uninstall()
        self.freezer.close()
        gc.unfreeze()  # an in-process caller (tests) gets its collector back whole
        log.info("detached; exiting")

    # ---- targets -------------------------------------------------------------
    def _on_exec(self, tgid: int, exe: str) -> None:
        """A newly exec'd program matching a target's glob is attached at once."""
        with self.lock:
            self.targets.on_exec(tgid, exe)

    def reload(self) -> None:
        """SIGHUP: attach added targets, detach removed ones, keep unchanged ones."""
        try:
            new = load_config(self.config.path)
        except RefcntdError as err:
            log.error("reload failed, keeping the running configuration: %s", err.message)
            return
        with self.lock:
            wanted = {t.name: t for t in new.targets}
            runtimes = self.targets.runtimes
            for name in list(runtimes):
                old = runtimes[name].target
                if name not in wanted or wanted[name].signature() != old.signature():
                    self.targets.remove(name)
            for name, target in wanted.items():
                if name not in runtimes:
                    self.targets.add(target)
                else:
                    self.targets.apply_live(runtimes[name], target)
            self._apply_settings(new)
            self.config = new
        log.info("reloaded %s: %d target(s)", new.path, len(self.targets.runtimes))

    def _apply_settings(self, new: Config) -> None:
        """Daemon-wide settings: applied live, or a log line saying a restart is needed."""
        old = self.config
        if (new.listen_host, new.listen_port) != (old.listen_host, old.listen_port):
            log.warning("listen %s:%d -> %s:%d needs a restart; still listening on %s:%d",
                        old.listen_host, old.listen_port, new.listen_host, new.listen_port,
                        old.listen_host, old.listen_port)
        if new.report_dir != old.report_dir:
            log.info("report_dir %s -> %s", old.report_dir, new.report_dir)
            stats = self.store.stats
            self.store = ReportStore(new.report_dir, new.retention)
            self.store.stats = stats  # counters never go down
        self.store.retention = new.retention
        self._next_prune = 0.0  # apply the new retention limits now, before "reloaded"
        self._prune_on_timer()

    def status(self) -> dict[str, object]:
        """What /status shows: per target, which binaries are attached and since when."""
        with self.lock.shared:
            return {"started": self.started, "config": self.config.path, "targets": {
                name: {"path": rt.target.path,
                       "attached": {path: {"probes": len(tr.plan.sites), "since": since,
                                           "build_ids": {m.path: m.build_id
                                                         for m in tr.plan.modules.values()}}
                                    for path, (tr, since) in _with_since(rt).items()},
                       "failed": dict(rt.failed)}
                for name, rt in self.targets.runtimes.items()}}

    # ---- reports ----------------------------------------------------------------
    def _on_report(self, runtime: TargetRuntime, binary: str, p: ProcessReport) -> None:
        """On the tracer's report worker: the counts (under their own lock), the files."""
        if _not_judged(p) and p.groups:
            p.notes.append(f"{p.exit_status}: its {p.leaked_objects} live objects are "
                           "reported, not judged (as `run` does: no leak check runs in a "
                           "killed process), nor counted in refcntd_leaked_objects_total")
        with runtime.stats.lock:
            self._count(runtime.stats, p, frozenset(runtime.target.spec.class_sources()))
        self._write_report(runtime, binary, p)

    @staticmethod
    def _count(stats: TargetStats, p: ProcessReport, classed: frozenset[str]) -> None:
        """`classed`: the spec's types whose class the exit scan reads."""
        if p.state != STATE_LIVE_AT_DETACH:
            stats.processes_reported += 1
            for group in [] if _not_judged(p) else p.groups:
                if not _failing(group):
                    stats.add(stats.reachable, group.type_name, len(group.objects))
                    continue
                stats.add(stats.leaked, group.type_name, len(group.objects))
                if group.type_name in classed:
                    stats.add(stats.leaked_classes,
                              (group.type_name, group.class_name or UNREAD), len(group.objects))
            for finding in p.misuse:
                stats.add(stats.anomalies, finding.kind, finding.occurrences)

    def _write_report(self, runtime: TargetRuntime, binary: str, p: ProcessReport) -> None:
        """The report of a process traced by the tracer of `binary`, with that tracer's
        status: binaries a glob matched can differ (a probe refused in one only)."""
        tracer = runtime.tracers.get(binary)
        result = RunResult("serve", runtime.target.spec.name, binary, [p])
        if tracer is not None:
            result.tracing = tracer.tracing_status(p.kernel_stats)
        text = report.render_process(p) + report.render_tracing(result.tracing)
        try:
            path = self.store.write(runtime.target.name, p.pid, reportjson.run_json(result), text)
        except OSError as err:
            log.error("target=%s pid=%d report not written to %s: %s", runtime.target.name,
                      p.pid, self.store.dir, err.strerror)
            return
        judged = p.state != STATE_LIVE_AT_DETACH and not _not_judged(p)
        level = logging.WARNING if (p.groups and judged) or p.misuse else logging.INFO
        log.log(level, "target=%s pid=%d %s: %s, %d anomalies; report %s",
                runtime.target.name, p.pid, _state(p), _objects(p, judged),
                sum(a.occurrences for a in p.misuse), path.name)

    # ---- metrics ----------------------------------------------------------------
    @contextlib.contextmanager
    def view(self) -> Iterator[list[TargetStats]]:
        """For a scrape, on an HTTP thread: copies of the counts; the tracers stay
        attached while the scrape reads their maps (target changes wait, capture does not;
        other readers, such as a pprof profile waiting on the report workers, do not)."""
        with self.lock.shared:
            yield [rt.stats.snapshot() for rt in self.targets.runtimes.values()]

    def collector(self) -> RefcntdCollector:
        return RefcntdCollector(self.view, lambda: self.store.stats)


def _not_judged(p: ProcessReport) -> bool:
    """A process killed by a signal: its leaks are reported, not judged, in every mode
    (run's policy, outputs/policy.py: LeakSanitizer checks nothing in such a process)."""
    return p.state == STATE_EXITED and p.exit_status.startswith("killed")


def _failing(group: LeakGroup) -> bool:
    """Whether `run` fails these objects by default: not when the exit scan found them
    still reachable, or made after it (policy.py's LeakSanitizer line)."""
    return group.kind not in (REACHABLE, LATE)


def _state(p: ProcessReport) -> str:
    return f"{p.state}, {p.exit_status}" if p.exit_status else p.state


def _objects(p: ProcessReport, judged: bool) -> str:
    """The log line's count, in the words of the report."""
    if p.state == STATE_LIVE_AT_DETACH:
        return f"{p.leaked_objects} objects still live at detach (not counted as leaks)"
    if not judged:
        return f"{p.leaked_objects} objects live at its end, not judged (killed)"
    kept = sum(len(g.objects) for g in p.groups if not _failing(g))
    if kept:
        return f"{p.leaked_objects - kept} leaked objects, {kept} still reachable"
    return f"{p.leaked_objects} leaked objects"


def _with_since(runtime: TargetRuntime) -> dict[str, tuple[Tracer, float]]:
    return {path: (tracer, runtime.attached_at.get(path, 0.0))
            for path, tracer in runtime.tracers.items()}
