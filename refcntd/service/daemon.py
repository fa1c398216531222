"""`refcntd serve`: trace configured programs continuously, export metrics,
write a report for every exiting traced process.

One Tracer (one BPF program) per binary a target's path matches, so a
reload can add and remove targets without touching the others' counts.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.analysis.model import STATE_LIVE_AT_DETACH, ProcessReport, RunResult
from refcntd.binary.plan import build_plan
from refcntd.binary.sitemode import parse_modes
from refcntd.errors import RefcntdError
from refcntd.inputs.config import Config, Target, load_config
from refcntd.inputs.files import FileStamp, file_identity, file_stamp
from refcntd.outputs import report
from refcntd.outputs.reportstore import ReportStore
from refcntd.service import checkpoint
from refcntd.service.metrics import RefcntdCollector, TargetStats
from refcntd.session.options import TraceOptions
from refcntd.session.tracer import Tracer

log = logging.getLogger("refcntd")
IDLE_S = 0.05
WATCH_EVERY_S = 1.0  # how often target paths are checked for new, replaced or removed files
RETENTION_EVERY_S = 60.0  # old reports are pruned on a timer, not only on the next write
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


@dataclass
class TargetRuntime:
    target: Target
    stats: TargetStats
    tracers: dict[str, Tracer] = field(default_factory=dict)  # binary path -> tracer
    attached_at: dict[str, float] = field(default_factory=dict)  # binary path -> time.time()
    identity: dict[str, tuple[int, int] | None] = field(default_factory=dict)  # (dev, inode)
    failed: dict[str, str] = field(default_factory=dict)  # binary path -> why
    # (dev, inode, size, mtime) of the file that failed: a file seen half-copied is
    # retried once its writer is done, even at the same inode
    failed_stamp: dict[str, FileStamp | None] = field(default_factory=dict)


class Daemon:
    def __init__(self, config: Config, strict: bool = False) -> None:
        self.config = config
        self.strict = strict
        self.targets: dict[str, TargetRuntime] = {}
        self.store = ReportStore(config.report_dir, config.retention)
        self.lock = threading.RLock()
        self.stop = False
        self.reload_requested = False
        self._proc_events = _ProcConnector()
        self.started = time.time()
        self.views = checkpoint.Views(self._all_tracers, self.lock)
        self._diff_requested = False
        self._next_prune = 0.0
        self._next_watch = 0.0
        self._pending_execs: list[tuple[int, str]] = []

    # ---- lifecycle -----------------------------------------------------------
    def attach_all(self) -> None:
        for target in self.config.targets:
            self._add_target(target)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGUSR1, lambda _s, _f: self.mark())
        signal.signal(signal.SIGUSR2, self._on_usr2)
        _sd_notify("READY=1")
        log.info("serving %d target(s)", len(self.targets))
        while not self.stop:
            # Capture: only this thread changes the set of targets, so reading it needs
            # no lock, and a scrape (which holds the lock) never delays the ring buffers.
            for runtime in list(self.targets.values()):
                for tracer in list(runtime.tracers.values()):
                    self._poll(runtime, tracer)
            self._pending_execs += self._proc_events.execs(IDLE_S)
            if not self.lock.acquire(blocking=False):
                continue  # a scrape or a diff reads the targets: change them next round
            try:
                self._manage()
            finally:
                self.lock.release()
        _sd_notify("STOPPING=1")
        self.shutdown()

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
        self._prune_on_timer()
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

    def _all_tracers(self) -> dict[str, list[Tracer]]:
        return {name: list(rt.tracers.values()) for name, rt in self.targets.items()}

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
            for runtime in list(self.targets.values()):
                self._follow(runtime)

    def _follow(self, runtime: TargetRuntime) -> None:
        """Attach binaries that appeared, re-attach replaced ones (package upgrades:
        a new inode at the same path), detach the ones that are gone."""
        name = runtime.target.name
        present = {p: file_identity(p) for p in glob.glob(runtime.target.path)}
        for path in list(runtime.tracers):
            now = present.get(path)
            if now == runtime.identity.get(path):
                continue
            why = "removed" if now is None else "replaced (new inode)"
            log.warning("target=%s binary=%s %s: detaching", name, path, why)
            self._detach_binary(runtime, path)
        for path, ident in sorted(present.items()):
            if ident is None or path in runtime.tracers:
                continue
            if path in runtime.failed and runtime.failed_stamp.get(path) == file_stamp(path):
                continue  # failed on this very file: retry only when it changes
            runtime.failed.pop(path, None)
            log.info("target=%s binary=%s appeared: attaching", name, path)
            self._attach_binary(runtime, path)
        if present:  # a glob that matched nothing at start is no longer a failure
            for path in [p for p in runtime.failed if p not in present]:
                del runtime.failed[path]
        runtime.stats.attach_errors = len(runtime.failed)

    def _detach_binary(self, runtime: TargetRuntime, path: str) -> None:
        tracer = runtime.tracers.pop(path)
        runtime.attached_at.pop(path, None)
        runtime.identity.pop(path, None)
        tracer.finish(RunResult("serve", runtime.target.spec.name, path))
        tracer.kernel.detach()
        runtime.stats.tracers = list(runtime.tracers.values())

    def _prune_on_timer(self) -> None:
        now = time.monotonic()
        if now < self._next_prune:
            return
        self._next_prune = now + RETENTION_EVERY_S
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
            for name in list(self.targets):
                self._remove_target(name)
        self._proc_events.close()
        log.info("detached; exiting")

    # ---- targets -------------------------------------------------------------
    def _add_target(self, target: Target) -> None:
        runtime = TargetRuntime(target, TargetStats(target.name, target.age_threshold_s,
                                                    target.max_type_labels))
        self.targets[target.name] = runtime
        paths = sorted(glob.glob(target.path)) or [target.path]
        for path in paths:
            self._attach_binary(runtime, path)

    def _attach_binary(self, runtime: TargetRuntime, path: str) -> None:
        target = runtime.target
        # Taken before reading the file: a binary still being copied in that fails as
        # "not an ELF file" is retried once it changed, even if the copy ends meanwhile.
        stamp = file_stamp(path)
        try:
            opts = TraceOptions(history=target.history, comm_filter=target.comm,
                                cgroup_id=_cgroup_id(target.cgroup), sites=True)
            # REFCNTD_PROBE_MODE, as for check/attach/run (serve has no --probe-mode)
            plan = build_plan(target.spec, path,
                              parse_modes(os.environ.get("REFCNTD_PROBE_MODE")))
            plan.require_complete()

            def on_report(p: ProcessReport, rt: TargetRuntime = runtime, b: str = path) -> None:
                self._on_report(rt, b, p)  # bound now: each binary reports with its own status
            tracer = Tracer(plan, filtered=False, opts=opts, on_report=on_report)
            tracer.start()
            self.views.adopt(tracer)  # a binary attached after the checkpoint
            if tracer.vetting.active:  # their later dlopens must stop them too
                tracer.adopt_running()
        except RefcntdError as err:
            runtime.failed[path] = err.message
            runtime.identity[path] = file_identity(path)
            runtime.failed_stamp[path] = stamp
            runtime.stats.attach_errors = len(runtime.failed)
            log.error("target=%s binary=%s cannot attach: %s", target.name, path, err.message)
            if self.strict:
                raise
            return
        runtime.tracers[path] = tracer
        runtime.attached_at[path] = time.time()
        runtime.identity[path] = file_identity(path)
        runtime.stats.tracers = list(runtime.tracers.values())
        runtime.stats.probes_failed = 0
        for probe in tracer.tracing_status().probes:
            if not probe.installed:
                log.error("target=%s binary=%s probe not installed: %s %s: %s", target.name,
                          path, probe.role, probe.function, probe.error)
        log.info("target=%s binary=%s attached (%d probes)", target.name, path,
                 len(plan.sites) - len(tracer.kernel.probes.failed_probes))

    def _remove_target(self, name: str) -> None:
        runtime = self.targets.pop(name)
        for path, tracer in runtime.tracers.items():
            tracer.finish(RunResult("serve", runtime.target.spec.name, path))
            tracer.kernel.detach()
        log.info("target=%s detached", name)

    def _on_exec(self, tgid: int, exe: str) -> None:
        """A newly exec'd program matching a target's glob is attached at once."""
        with self.lock:
            for runtime in self.targets.values():
                if exe in runtime.identity and runtime.identity[exe] != file_identity(exe):
                    self._follow(runtime)  # replaced since attached: don't wait for the timer
                retry = exe not in runtime.failed or \
                    runtime.failed_stamp.get(exe) != file_stamp(exe)
                if exe not in runtime.tracers and retry and \
                        fnmatch.fnmatch(exe, runtime.target.path):
                    runtime.failed.pop(exe, None)
                    log.info("target=%s new binary %s (pid %d)", runtime.target.name, exe, tgid)
                    self._attach_binary(runtime, exe)

    def reload(self) -> None:
        """SIGHUP: attach added targets, detach removed ones, keep unchanged ones."""
        try:
            new = load_config(self.config.path)
        except RefcntdError as err:
            log.error("reload failed, keeping the running configuration: %s", err.message)
            return
        with self.lock:
            wanted = {t.name: t for t in new.targets}
            for name in list(self.targets):
                old = self.targets[name].target
                if name not in wanted or wanted[name].signature() != old.signature():
                    self._remove_target(name)
            for name, target in wanted.items():
                if name not in self.targets:
                    self._add_target(target)
                else:
                    self._apply_live(self.targets[name], target)
            self._apply_settings(new)
            self.config = new
        log.info("reloaded %s: %d target(s)", new.path, len(self.targets))

    def _apply_live(self, runtime: TargetRuntime, target: Target) -> None:
        """Settings of a kept target that need no new probes."""
        if target.age_threshold_s != runtime.target.age_threshold_s:
            log.info("target=%s age_threshold %.0fs -> %.0fs", target.name,
                     runtime.target.age_threshold_s, target.age_threshold_s)
        runtime.target = target
        runtime.stats.age_threshold_s = target.age_threshold_s
        runtime.stats.max_type_labels = target.max_type_labels

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
        with self.lock:
            return {"started": self.started, "config": self.config.path, "targets": {
                name: {"path": rt.target.path,
                       "attached": {path: {"probes": len(tr.plan.sites), "since": since,
                                           "build_ids": {m.path: m.build_id
                                                         for m in tr.plan.modules.values()}}
                                    for path, (tr, since) in _with_since(rt).items()},
                       "failed": dict(rt.failed)}
                for name, rt in self.targets.items()}}

    # ---- reports ----------------------------------------------------------------
    def _on_report(self, runtime: TargetRuntime, binary: str, p: ProcessReport) -> None:
        """On the tracer's report worker: the counts (under their own lock), the files."""
        with runtime.stats.lock:
            self._count(runtime.stats, p)
        self._write_report(runtime, binary, p)

    @staticmethod
    def _count(stats: TargetStats, p: ProcessReport) -> None:
        if p.state != STATE_LIVE_AT_DETACH:
            stats.processes_reported += 1
            for group in p.groups:
                stats.add(stats.leaked, group.type_name, len(group.objects))
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
            path = self.store.write(runtime.target.name, p.pid, report.run_json(result), text)
        except OSError as err:
            log.error("target=%s pid=%d report not written to %s: %s", runtime.target.name,
                      p.pid, self.store.dir, err.strerror)
            return
        level = logging.WARNING if p.groups or p.misuse else logging.INFO
        log.log(level, "target=%s pid=%d %s: %d leaked objects, %d anomalies; report %s",
                runtime.target.name, p.pid, p.state, p.leaked_objects,
                sum(a.occurrences for a in p.misuse), path.name)

    # ---- metrics ----------------------------------------------------------------
    @contextlib.contextmanager
    def view(self) -> Iterator[list[TargetStats]]:
        """For a scrape, on an HTTP thread: copies of the counts; the tracers stay
        attached while the scrape reads their maps (target changes wait, capture does not)."""
        with self.lock:
            yield [rt.stats.snapshot() for rt in self.targets.values()]

    def collector(self) -> RefcntdCollector:
        return RefcntdCollector(self.view, lambda: self.store.stats)


def _with_since(runtime: TargetRuntime) -> dict[str, tuple[Tracer, float]]:
    return {path: (tracer, runtime.attached_at.get(path, 0.0))
            for path, tracer in runtime.tracers.items()}


class _JournalFormatter(logging.Formatter):
    """One event per line; under journald a <N> syslog priority prefix sets the level."""

    PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname} {record.getMessage()}".replace("\n", " ")
        if os.environ.get("JOURNAL_STREAM"):
            return f"<{self.PRIORITY.get(record.levelname, 6)}>{line}"
        return line


def setup_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_JournalFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def _cgroup_id(path: str | None) -> int | None:
    """cgroup v2 id (the directory's inode) of a cgroup path, as BPF sees it."""
    if path is None:
        return None
    for root in CGROUP_ROOTS:
        candidate = Path(root + path)
        if candidate.is_dir() and (candidate / "cgroup.procs").exists():
            return candidate.stat().st_ino
    raise RefcntdError(f"cgroup {path} not found under {' or '.join(CGROUP_ROOTS)}")


def _sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) that probes are attached; no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(state.encode(), address)


PROC_EVENT_EXEC = 0x2
_NLMSG_HDR, _CN_MSG_HDR, _PROC_EVENT_HDR = 16, 20, 16  # then the event's own fields


def _exec_tgids(data: bytes) -> list[int]:
    """tgids of PROC_EVENT_EXEC messages in one datagram (linux/cn_proc.h layout).

    Decoded here because pyroute2 0.9's ProcEventSocket.get() drops all but
    the first event when several are pending.
    """
    out, offset = [], 0
    while offset + _NLMSG_HDR + _CN_MSG_HDR + _PROC_EVENT_HDR + 8 <= len(data):
        length = struct.unpack_from("<I", data, offset)[0]
        event = offset + _NLMSG_HDR + _CN_MSG_HDR
        if struct.unpack_from("<I", data, event)[0] == PROC_EVENT_EXEC:
            out.append(struct.unpack_from("<I", data, event + _PROC_EVENT_HDR + 4)[0])
        if length < _NLMSG_HDR:
            break
        offset += (length + 3) & ~3
    return out


class _ProcConnector:
    """exec events from the netlink proc connector: prompt discovery of new binaries.

    Only a hint: exits are taken from the ordered BPF stream (see DESIGN.md).
    """

    def __init__(self) -> None:
        self.sock = None
        try:
            from pyroute2 import ProcEventSocket
            self.sock = ProcEventSocket()
            self.sock.bind()
            self.sock.control(listen=True)
        except Exception as err:  # noqa: BLE001 - optional: globs are then matched at load only
            log.warning("proc connector unavailable (%s): new binaries matching a glob are "
                        "attached only on reload", err)
            self.sock = None

    def execs(self, timeout: float) -> list[tuple[int, str]]:
        """(tgid, executable) of programs exec'd since the last call."""
        if self.sock is None:
            time.sleep(timeout)
            return []
        ready, _, _ = select.select([self.sock], [], [], timeout)
        out = []
        while ready:
            try:
                data = self.sock.recv(65536, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # ENOBUFS: events were lost; globs catch up on reload
                log.warning("proc connector: %s", err.strerror)
                break
            for tgid in _exec_tgids(data):
                with contextlib.suppress(OSError):
                    out.append((tgid, os.readlink(f"/proc/{tgid}/exe")))
        return out

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
