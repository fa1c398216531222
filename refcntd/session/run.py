"""`refcntd run`: start the command held at a gate, register it, release it, and
trace it and its descendants to their end (signals to refcntd go to the command)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from refcntd import progress
from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.binary.plan import Plan
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.kernel.procctl import die_with_parent
from refcntd.session.options import Credentials, TraceOptions
from refcntd.session.status import UNMAPPED, mapped_probed, nothing_loaded
from refcntd.session.tracer import Tracer
from refcntd.session.unwind import command_path


def run_command(plan: Plan, command: list[str], opts: TraceOptions,
                on_report: Callable[[ProcessReport], None],
                early: BackgroundCompile | None = None) -> RunResult:
    """Start `command` gated, register it, release it, trace it and its descendants."""
    result = RunResult("run", plan.spec.name, command[0])
    with Tracer(plan, filtered=True, opts=opts, on_report=on_report, early=early) as tracer:
        tracer.start()
        tracer.unwind.add([p for p in [command_path(command)] if p])
        with progress.stage("per-process setup"):
            child = Child(command, opts.run_as)
            root_gen = tracer.kernel.register_process(child.pid)
            tracer.tracker.add_root(child.pid, root_gen, command)
        tracer.tracker.wait_status = lambda tgid: _wait_root(child, tgid)
        child.release()
        with _forward_signals(child):
            _trace_until_done(tracer, child, opts.descendant_grace_s)
        result.command_status = _shell_status(child.wait(30.0))
        return _nothing_fired(tracer.finish(result), plan, tracer.loaded | tracer.execd,
                              tracer.ldso_watched)


NOTHING_FIRED = ("no probe fired in this run: nothing the spec describes was counted (the "
                 "note says which file no traced process mapped)")


def _nothing_fired(result: RunResult, plan: Plan, seen: set[str], watched: bool) -> RunResult:
    """A run whose probes never fired, in a file no traced process mapped (`seen`: what
    they loaded and ran), audited nothing: incomplete, never clean (a spec naming a copy
    of the library the command does not load, a test that never ran), unless nothing of
    the spec's library was demonstrably there to count (ld.so `watched`, and
    status.nothing_loaded: GLib's `bytes`, which never loads libgobject, under the gobject
    spec): complete, with that one note in place of the unmapped file's.  Where a traced
    process mapped a probed file the probes were armed: it made none of the spec's
    objects, which the tracing status notes (status.silent_roles).  `--strict` fails
    every run in which no probe fired."""
    tracing = result.tracing
    if not tracing.probes or any(p.hits > 0 for p in tracing.probes) \
            or mapped_probed(plan, seen):
        return result
    absent = nothing_loaded(plan, seen) if watched else None
    if absent is None:
        tracing.lost[NOTHING_FIRED] = 1
    else:
        tracing.notes = [absent, *(n for n in tracing.notes if not n.startswith(UNMAPPED))]
    return result


class Child:
    """The command started by `run`: forked, held at a gate until traced, then exec'd."""

    def __init__(self, command: list[str], run_as: Credentials | None = None) -> None:
        read_end, write_end = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - replaced by exec
            _exec_after_gate(command, read_end, write_end, parent, run_as)
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


def _exec_after_gate(command: list[str], read_end: int, write_end: int, parent: int,
                     run_as: Credentials | None) -> None:
    try:
        die_with_parent(parent)  # a SIGKILLed refcntd must not leave CMD running
        os.close(write_end)
        os.read(read_end, 1)
        os.close(read_end)
        if run_as is not None:  # groups, then gid, then uid: each needs the one before
            os.setgroups(list(run_as.groups))
            os.setgid(run_as.gid)
            os.setuid(run_as.uid)  # all capabilities go with uid 0
            die_with_parent(parent)  # setuid clears the death signal
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


