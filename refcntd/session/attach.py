"""`refcntd attach`: trace until SIGINT/SIGTERM, system-wide or a process tree."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from refcntd import progress
from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.binary.plan import Plan
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.options import TraceOptions
from refcntd.session.tracer import Tracer


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
                    tracer.tracker.predating.add(tgid)  # as system-wide (adopt_running)
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

