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
from refcntd.errors import RefcntdError
from refcntd.inputs.config import Config, Target, load_config
from refcntd.outputs import report
from refcntd.outputs.reportstore import ReportStore
from refcntd.service.metrics import RefcntdCollector, TargetStats
from refcntd.session.tracer import TraceOptions, Tracer

log = logging.getLogger("refcntd")
IDLE_S = 0.05
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


@dataclass
class TargetRuntime:
    target: Target
    stats: TargetStats
    tracers: dict[str, Tracer] = field(default_factory=dict)  # binary path -> tracer
    failed: dict[str, str] = field(default_factory=dict)  # binary path -> why


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

    # ---- lifecycle -----------------------------------------------------------
    def attach_all(self) -> None:
        for target in self.config.targets:
            self._add_target(target)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        _sd_notify("READY=1")
        log.info("serving %d target(s)", len(self.targets))
        while not self.stop:
            with self.lock:
                for runtime in list(self.targets.values()):
                    for tracer in list(runtime.tracers.values()):
                        tracer.kernel.poll(0)
            for tgid, exe in self._proc_events.execs(IDLE_S):
                self._on_exec(tgid, exe)
            if self.reload_requested:
                self.reload_requested = False
                self.reload()
        _sd_notify("STOPPING=1")
        self.shutdown()

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
        runtime = TargetRuntime(target, TargetStats(target.name, target.age_threshold_s))
        self.targets[target.name] = runtime
        paths = sorted(glob.glob(target.path)) or [target.path]
        for path in paths:
            self._attach_binary(runtime, path)

    def _attach_binary(self, runtime: TargetRuntime, path: str) -> None:
        target = runtime.target
        try:
            opts = TraceOptions(history=target.history, comm_filter=target.comm,
                                cgroup_id=_cgroup_id(target.cgroup))
            plan = build_plan(target.spec, path)
            plan.require_complete()
            tracer = Tracer(plan, filtered=False, opts=opts,
                            on_report=lambda p, rt=runtime, b=path: self._on_report(rt, b, p))
            tracer.start()
        except RefcntdError as err:
            runtime.failed[path] = err.message
            runtime.stats.attach_errors = len(runtime.failed)
            log.error("target=%s binary=%s cannot attach: %s", target.name, path, err.message)
            if self.strict:
                raise
            return
        runtime.tracers[path] = tracer
        runtime.stats.tracers = list(runtime.tracers.values())
        runtime.stats.probes_failed = 0
        for probe in tracer.tracing_status().probes:
            if not probe.installed:
                log.error("target=%s binary=%s probe not installed: %s %s: %s", target.name,
                          path, probe.role, probe.function, probe.error)
        log.info("target=%s binary=%s attached (%d probes)", target.name, path,
                 len(plan.sites) - len(tracer.kernel.failed_probes))

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
                if exe not in runtime.tracers and exe not in runtime.failed and \
                        fnmatch.fnmatch(exe, runtime.target.path):
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
            self.config = new
            self.store.retention = new.retention
        log.info("reloaded %s: %d target(s)", new.path, len(self.targets))

    # ---- reports ----------------------------------------------------------------
    def _on_report(self, runtime: TargetRuntime, binary: str, p: ProcessReport) -> None:
        stats = runtime.stats
        if p.state != STATE_LIVE_AT_DETACH:
            stats.processes_reported += 1
            for group in p.groups:
                stats.add(stats.leaked, group.type_name, len(group.objects))
                for obj in group.objects:
                    stats.add(stats.exited_ops, (group.type_name, "init"))
                    stats.add(stats.exited_ops, (group.type_name, "get"), obj.gets)
                    stats.add(stats.exited_ops, (group.type_name, "put"), obj.puts)
            for finding in p.misuse:
                stats.add(stats.anomalies, finding.kind, finding.occurrences)
        self._write_report(runtime, binary, p)

    def _write_report(self, runtime: TargetRuntime, binary: str, p: ProcessReport) -> None:
        """The report of a process traced by the tracer of `binary`, with that tracer's
        status: binaries a glob matched can differ (a probe refused in one only)."""
        tracer = runtime.tracers.get(binary)
        result = RunResult("serve", runtime.target.spec.name, binary, [p])
        if tracer is not None:
            result.tracing = tracer.tracing_status()
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
        with self.lock:
            yield [rt.stats for rt in self.targets.values()]

    def collector(self) -> RefcntdCollector:
        return RefcntdCollector(self.view, lambda: self.store.stats)


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
