"""The binaries of serve's targets: one Tracer (one BPF program) per binary a
target's path matches, attached at start, when a matching file appears, is
replaced (a package upgrade: a new inode) or is exec'd, and detached when it is
removed or its target goes.  The caller holds the daemon's lock around every
change (scrapes and diffs read the tracers under it), but not around the attach
or the detach themselves: seconds of work on a tracer no reader sees (`unlocked`)."""

from __future__ import annotations

import fnmatch
import glob
import logging
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.binary.elf import ElfImage
from refcntd.binary.plan import build_plan
from refcntd.binary.sitemode import parse_modes
from refcntd.errors import ConfigError, RefcntdError
from refcntd.inputs.config import Target
from refcntd.inputs.files import FileStamp, file_identity, file_stamp
from refcntd.inputs.rootpaths import beside, split_root
from refcntd.service.metrics import TargetStats
from refcntd.session.options import TraceOptions
from refcntd.session.tracer import Tracer

log = logging.getLogger("refcntd")
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
OnReport = Callable[["TargetRuntime", str, ProcessReport], None]  # (target, binary, report)


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
    # binary path -> the other target already tracing that very file (unscoped both):
    # retried once that target no longer traces it
    claimed_by: dict[str, str] = field(default_factory=dict)


class Targets:
    """Every target by name, with its attached binaries."""

    def __init__(self, on_report: OnReport, adopt: Callable[[Tracer], None],
                 strict: bool = False,
                 unlocked: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
        """`on_report`: a traced process's report, on its tracer's report worker;
        `adopt(tracer)`: a tracer just attached (it counts from the checkpoint);
        `strict`: a binary that cannot be attached raises instead of being logged;
        `unlocked()`: the daemon's lock let go while a new tracer attaches."""
        self.runtimes: dict[str, TargetRuntime] = {}
        self._on_report, self._adopt, self.strict = on_report, adopt, strict
        self._unlocked = unlocked
        # tracers attached and detached so far: the daemon freezes the garbage collector's
        # generations on them (gcpauses.py)
        self.attached = self.detached = 0

    def tracers(self) -> dict[str, list[Tracer]]:
        return {name: list(rt.tracers.values()) for name, rt in self.runtimes.items()}

    def add(self, target: Target) -> None:
        runtime = TargetRuntime(target, TargetStats(target.name, target.age_threshold_s,
                                                    target.max_type_labels, target.warm_up_s))
        paths = sorted(glob.glob(target.path)) or [target.path]
        for path in paths:
            self._attach_binary(runtime, path)
        # shown to readers (/status, scrapes) once attached: the attach lets them in
        # meanwhile, and a target listed before its probes exist looks ready when not
        self.runtimes[target.name] = runtime

    def remove(self, name: str) -> None:
        runtime = self.runtimes.pop(name)
        for path, tracer in runtime.tracers.items():
            self._retire(runtime, path, tracer)
        log.info("target=%s detached", name)

    def apply_live(self, runtime: TargetRuntime, target: Target) -> None:
        """Settings of a kept target that need no new probes."""
        if target.age_threshold_s != runtime.target.age_threshold_s:
            log.info("target=%s age_threshold %.0fs -> %.0fs", target.name,
                     runtime.target.age_threshold_s, target.age_threshold_s)
        runtime.target = target
        runtime.stats.age_threshold_s = target.age_threshold_s
        runtime.stats.max_type_labels = target.max_type_labels
        runtime.stats.warm_up_s = target.warm_up_s

    def follow(self, runtime: TargetRuntime) -> None:
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
            if path in runtime.claimed_by:
                if self._claimer(runtime, path) is not None:
                    continue
                runtime.claimed_by.pop(path)
                runtime.failed.pop(path, None)  # its claimer let it go: ours now
            if path in runtime.failed and runtime.failed_stamp.get(path) == file_stamp(path):
                continue  # failed on this very file: retry only when it changes
            runtime.failed.pop(path, None)
            log.info("target=%s binary=%s appeared: attaching", name, path)
            self._attach_binary(runtime, path)
        if present:  # a glob that matched nothing at start is no longer a failure
            for path in [p for p in runtime.failed if p not in present]:
                del runtime.failed[path]
        runtime.stats.attach_errors = len(runtime.failed)

    def on_exec(self, tgid: int, exe: str) -> None:
        """A newly exec'd program matching a target's glob is attached at once.  `exe` is
        the path the kernel reports, as the process's root names it: for a target named
        through /proc/PID/root it is taken in that root."""
        for runtime in self.runtimes.values():
            if split_root(runtime.target.path)[0]:
                self._on_exec(runtime, tgid, beside(runtime.target.path, exe))
            else:
                self._on_exec(runtime, tgid, exe)

    def _on_exec(self, runtime: TargetRuntime, tgid: int, exe: str) -> None:
        if exe in runtime.identity and runtime.identity[exe] != file_identity(exe):
            self.follow(runtime)  # replaced since attached: don't wait for the timer
        retry = exe not in runtime.failed or runtime.failed_stamp.get(exe) != file_stamp(exe)
        if exe not in runtime.tracers and retry and fnmatch.fnmatch(exe, runtime.target.path):
            runtime.failed.pop(exe, None)
            log.info("target=%s new binary %s (pid %d)", runtime.target.name, exe, tgid)
            self._attach_binary(runtime, exe)

    def _detach_binary(self, runtime: TargetRuntime, path: str) -> None:
        tracer = runtime.tracers.pop(path)
        runtime.attached_at.pop(path, None)
        runtime.identity.pop(path, None)
        runtime.stats.tracers = list(runtime.tracers.values())  # before readers come in
        self._retire(runtime, path, tracer)

    def _retire(self, runtime: TargetRuntime, path: str, tracer: Tracer) -> None:
        """A tracer no reader can reach any more: its last reports built, then detached,
        with the daemon's lock let go (the soak's detaches of 0.5 s held every scrape
        that long).  A failed report is logged: the tracer is detached all the same."""
        with self._unlocked():
            try:
                tracer.finish(RunResult("serve", runtime.target.spec.name, path))
            except Exception:  # noqa: BLE001 - the other tracers must still detach
                log.exception("target=%s binary=%s: its last reports failed",
                              runtime.target.name, path)
            finally:
                tracer.close()  # continues every process it held stopped
                self.detached += 1

    def _claimer(self, runtime: TargetRuntime, path: str) -> str | None:
        """The other target already tracing the file at `path` (the same device and
        inode, under any path), where neither target narrows its processes by `comm:`
        or `cgroup:`: each of its processes would be traced, held, scanned and reported
        twice, once per target.  The first target (in the config's order) keeps it."""
        ident = file_identity(path)
        if ident is None or runtime.target.comm or runtime.target.cgroup:
            return None
        for other in self.runtimes.values():
            if other is runtime or other.target.comm or other.target.cgroup:
                continue
            if any(other.identity.get(p) == ident for p in other.tracers):
                return other.target.name
        return None

    def _attach_binary(self, runtime: TargetRuntime, path: str) -> None:
        target = runtime.target
        # Taken before reading the file: a binary still being copied in that fails as
        # "not an ELF file" is retried once it changed, even if the copy ends meanwhile.
        stamp = file_stamp(path)
        claimer = self._claimer(runtime, path)
        if claimer is not None:
            runtime.claimed_by[path] = claimer
            runtime.failed[path] = f"already traced by target {claimer}: a process is " \
                "traced by one target (narrow one of them with comm: or cgroup:)"
            runtime.identity[path] = file_identity(path)
            runtime.failed_stamp[path] = stamp
            runtime.stats.attach_errors = len(runtime.failed)
            log.error("target=%s binary=%s not attached: %s", target.name, path,
                      runtime.failed[path])
            return
        try:
            with self._unlocked():  # readers go on meanwhile; it is not theirs yet
                tracer = self._start(runtime, path)
        except RefcntdError as err:
            runtime.failed[path] = err.message
            runtime.identity[path] = file_identity(path)
            runtime.failed_stamp[path] = stamp
            runtime.stats.attach_errors = len(runtime.failed)
            log.error("target=%s binary=%s cannot attach: %s", target.name, path, err.message)
            if self.strict:
                raise
            return
        self._adopt(tracer)  # again: a checkpoint taken while it attached
        runtime.tracers[path] = tracer
        runtime.attached_at[path] = time.time()
        runtime.identity[path] = file_identity(path)
        runtime.stats.tracers = list(runtime.tracers.values())
        runtime.stats.probes_failed = 0
        self.attached += 1
        for probe in tracer.tracing_status().probes:
            if not probe.installed:
                log.error("target=%s binary=%s probe not installed: %s %s: %s", target.name,
                          path, probe.role, probe.function, probe.error)
        log.info("target=%s binary=%s attached (%d probes)", target.name, path,
                 len(tracer.plan.sites) - len(tracer.kernel.probes.failed_probes))

    def _start(self, runtime: TargetRuntime, path: str) -> Tracer:
        """A tracer attached to the binary at `path`, reporting with its own status."""
        target = runtime.target
        programs = _program(path)
        opts = TraceOptions(history=target.history, comm_filter=target.comm,
                            programs=programs, cgroup_id=_cgroup_id(target), sites=True,
                            leak_kinds=target.leak_kinds and bool(programs))
        # REFCNTD_PROBE_MODE, as for check/attach/run (serve has no --probe-mode)
        spec = target.spec.scanned() if opts.leak_kinds else target.spec
        plan = build_plan(spec, path, parse_modes(os.environ.get("REFCNTD_PROBE_MODE")))
        plan.require_complete()

        def on_report(p: ProcessReport) -> None:
            self._on_report(runtime, path, p)  # each binary reports with its own status
        # each report is written as it comes: none kept in memory for months
        tracer = Tracer(plan, filtered=False, opts=opts, on_report=on_report, keep_reports=False)
        try:
            tracer.start()
            self._adopt(tracer)  # a binary attached after the checkpoint
            # processes already running: their mappings and tables (whole stacks), and
            # the modules they map scanned (their later dlopens must stop them too)
            tracer.adopt_running()
        except BaseException:
            tracer.close()  # never a probe (or a stopped process) without its owner
            raise
        return tracer


def _program(path: str) -> tuple[str, ...]:
    """A target whose path is a program traces the processes running it, and no
    other, also when its spec probes a library every process maps (libgstreamer);
    one whose path is a library, every process that maps it."""
    return () if ElfImage(Path(path)).is_shared_library else (path,)


def _cgroup_id(target: Target) -> int | None:
    """cgroup v2 id (the directory's inode) of the target's cgroup, as BPF sees it."""
    if target.cgroup is None:
        return None
    for root in CGROUP_ROOTS:
        candidate = Path(root + target.cgroup)
        if candidate.is_dir() and (candidate / "cgroup.procs").exists():
            return candidate.stat().st_ino
    raise ConfigError(*target.cgroup_at, f"cgroup {target.cgroup} not found under "
                      f"{' or '.join(CGROUP_ROOTS)}")
