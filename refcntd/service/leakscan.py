"""`GET /leaks` on `serve` and `attach --listen` (`refcntd checkpoint --scan`): the
objects definitely or indirectly lost now, in processes that never exit.

Each traced process with live objects is stopped (SIGSTOP), its memory scanned
(refcntd/reach/, read-only), and continued; its live objects are read from the
kernel while it is stopped, so the scan and the objects describe one moment.  The
stop is bounded: a process whose writable memory would take longer to read than the
budget (`?budget_ms=`, default DEFAULT_BUDGET_S, from the rate measured in
benchmarks/results/leak-kinds.md) is not stopped at all, and the answer says so in
one line.  It stops processes, so like POST /checkpoint it is off unless
web.enable_checkpoint (serve) or --web-enable-checkpoint (attach) is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from refcntd.analysis.classes import apply_classes
from refcntd.analysis.kinds import UNHELD, apply_kinds
from refcntd.analysis.leaks import ProcessModules, group_leaks
from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.inputs.spec import ClassSource
from refcntd.kernel import features
from refcntd.kernel.records import ObjectRecord
from refcntd.outputs.reportjson import run_json
from refcntd.reach import livecopy
from refcntd.reach.chunks import compiled
from refcntd.reach.glibc import blocks_read, read_heap
from refcntd.reach.gtypes import note, prepare_for, read_classes
from refcntd.reach.memory import ProcessMemory, read_maps
from refcntd.reach.scan import INDIRECTLY, ReachScan, copy_process, finish, read_copy, read_process
from refcntd.session.exitscan import wait_stopped
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.tracer import Tracer
from refcntd.session.vetting import continue_blocker, mark_held
from refcntd.symbolize.perfmap import load_perf_map

if TYPE_CHECKING:
    from refcntd.service.checkpoint import Route, Views

DEFAULT_BUDGET_S = 1.0
# the stop, per GiB of writable memory and per malloc block: benchmarks/leakkinds.py on
# 2026-11-28 at 17:42-17:45 UTC, load 2-3 (benchmarks/results/leak-kinds.md: the process
# stopped only while its memory is read and its chunks walked): 1 GiB of 4 KiB blocks
# 0.32-0.56 s, of 1 KiB blocks 0.39-0.63 s, 13.4 M blocks of 64 bytes 0.60-0.65 s; the
# figures below are above each of those.  Without the compiled walker (0.90 s and 1.29 s
# for 4 KiB and 64-byte blocks) likewise.  Plus what any scan costs (maps, threads,
# libc's data: 64 MiB heaps stopped 0.04-0.06 s)
SECONDS_PER_SCAN = 0.05
SECONDS_PER_GIB, SECONDS_PER_BLOCK = 0.6, 0.025e-6
SECONDS_PER_GIB_NUMPY, SECONDS_PER_BLOCK_NUMPY = 1.2, 0.05e-6
# the copy (livecopy.py) is the read above without the walk: the same rate, so that the
# same processes are scanned as before.  On the VM of 2026-12-03 process_vm_readv alone
# ran at 0.8-1.3 s per GiB (load 6-16): stops there exceed it (leak-kinds.md)
COPY_SECONDS_PER_GIB = SECONDS_PER_GIB
LOST = ("definitely lost", INDIRECTLY, UNHELD)  # UNHELD: a reference nobody holds
SetAside = Callable[[int, list[int]], int]  # (pid, objects flagged): kernel/objects.py
Classing = tuple[dict[str, ClassSource], SetAside | None]  # what _read_classes needs


@dataclass
class LiveScan:
    """One process's scan: the stop it cost, or why it was not scanned."""

    pid: int
    stopped_s: float = 0.0
    skipped: str = ""
    scan: ReachScan | None = None
    objects: list[ObjectRecord] = field(default_factory=list)
    classes: dict[int, str] = field(default_factory=dict)  # read in the stop (gtypes.py)
    class_notes: list[str] = field(default_factory=list)
    how: str = ""  # "copy", "soft-dirty" (copied while it ran, then what changed), "stopped"
    why: str = ""  # scanned while stopped: why not copied
    copied_bytes: int = 0  # in the stop (soft-dirty: the copy while it ran too)
    recopied_bytes: int = 0  # soft-dirty: in the stop


def routes(views: Views, enabled: bool) -> dict[str, Route]:
    def answer(method: str, query: str) -> tuple[str, str, bytes]:
        if not enabled:
            return ("403 Forbidden", "text/plain", b"GET /leaks stops processes: set "
                    b"web.enable_checkpoint (serve) or --web-enable-checkpoint (attach)\n")
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        budget, copy_limit = _budget(query), _copy_limit(query)
        if budget is None:
            return "400 Bad Request", "text/plain", b"budget_ms: a number of milliseconds\n"
        if copy_limit is None:
            return "400 Bad Request", "text/plain", b"copy_mib: a number of MiB, 0 or more\n"
        body = json.dumps(leaks_json(views, budget, copy_limit), indent=2).encode()
        return "200 OK", "application/json", body
    return {"/leaks": answer}


def _budget(query: str) -> float | None:
    raw = parse_qs(query).get("budget_ms", [str(DEFAULT_BUDGET_S * 1000)])[-1]
    try:
        value = float(raw) / 1000
    except ValueError:
        return None
    return value if value > 0 else None


def _copy_limit(query: str) -> int | None:
    """?copy_mib=: the copy's bound (livecopy.py), 0: scan while stopped."""
    raw = parse_qs(query).get("copy_mib", [str(livecopy.LIMIT >> 20)])[-1]
    try:
        value = int(float(raw) * 2**20)
    except ValueError:
        return None
    return value if value >= 0 else None


def leaks_json(views: Views, budget_s: float, copy_limit: int = livecopy.LIMIT
               ) -> dict[str, object]:
    """Per target, a run of the processes scanned: their lost objects only, plus each
    process's stop time and the processes not scanned."""
    why = continue_blocker()
    targets: dict[str, object] = {}
    with views.lock:
        for name, tracers in sorted(views.tracers().items()):
            result, stops = RunResult("live", "", name), list[dict[str, object]]()
            for tracer in tracers:
                result.spec = tracer.plan.spec.name
                for live in scan_tracer(tracer, budget_s, why, copy_limit):
                    stops.append({"pid": live.pid, "stopped_s": round(live.stopped_s, 6),
                                  "skipped": live.skipped, "how": live.how,
                                  "copied_bytes": live.copied_bytes,
                                  "recopied_bytes": live.recopied_bytes, "why": live.why})
                    if live.scan is not None:
                        result.processes.append(tracer.worker.call(
                            partial(lost_report, tracer, live, views.show_cmdline)))
            targets[name] = {"run": run_json(result), "scans": stops}
    return {"budget_s": budget_s, "copy_limit_bytes": copy_limit, "targets": targets}


def scan_tracer(tracer: Tracer, budget_s: float, blocker: str | None,
                copy_limit: int = livecopy.LIMIT) -> list[LiveScan]:
    """Every process of the tracer with live objects, scanned in turn."""
    by_pid: dict[int, list[ObjectRecord]] = {}
    for rec in tracer.kernel.objects.live_objects():
        by_pid.setdefault(rec.tgid, []).append(rec)
    out = []
    for pid in sorted(by_pid):
        if blocker and os.geteuid() != 0:
            out.append(LiveScan(pid, skipped=f"not stopped: {blocker}"))
            continue
        out.append(scan_live(pid, budget_s, partial(_objects_of, tracer, pid), copy_limit,
                             classes=tracer.plan.spec.class_sources(),
                             set_aside=tracer.kernel.objects.set_aside))
    return out


def _objects_of(tracer: Tracer, pid: int) -> list[ObjectRecord]:
    """Read while the process is stopped: the objects of the scan's moment."""
    return [r for r in tracer.kernel.objects.live_objects() if r.tgid == pid]


def estimate_s(pid: int) -> tuple[float, int, int]:
    """The expected stop, from the writable bytes a scan may read and the malloc blocks
    it will walk, counted by walking the heap while the process runs (read-only; a
    heap changing under the walk counts as one block per 64 bytes, the worst case)."""
    maps = read_maps(pid)
    size = sum(m.size for m in maps if m.writable)
    mem = ProcessMemory(pid)
    try:
        heap = read_heap(mem, maps)
    finally:
        mem.close()
    blocks = blocks_read(heap) if heap.recognised else size // 64
    return expected_stop_s(size, blocks), size, blocks


def expected_stop_s(writable_bytes: int, blocks: int) -> float:
    per_gib, per_block = (SECONDS_PER_GIB, SECONDS_PER_BLOCK) if compiled() is not None \
        else (SECONDS_PER_GIB_NUMPY, SECONDS_PER_BLOCK_NUMPY)
    return SECONDS_PER_SCAN + writable_bytes / 2**30 * per_gib + blocks * per_block


def scan_live(pid: int, budget_s: float,
              objects: Callable[[], list[ObjectRecord]] = list,
              copy_limit: int = livecopy.LIMIT, pre_copy: bool | None = None,
              classes: dict[str, ClassSource] | None = None,
              set_aside: SetAside | None = None) -> LiveScan:
    """Stop `pid`, read its objects, copy its memory (livecopy.py; with soft-dirty pages
    only what changed since a copy made while it ran), continue it, then scan the copy
    and find the kinds (of the stopped moment): unless over the budget.  Over the
    copy's bound (`copy_limit` bytes, 0: never copy) it is scanned while stopped, as
    before.  A process that was already stopped (by a hold, by its user) stays
    stopped.  `pre_copy`: with soft-dirty pages or not (None: where the kernel has them).
    `classes`: the types whose objects' class is read in the stop (gtypes.py);
    `set_aside(pid, objects)`: those the library flags "may be leaked" then, removed
    from the kernel's live objects (kernel/objects.py) and from the scan's."""
    if classes:
        prepare_for(pid)  # GLib's layouts decoded before the stop, not during it
    size = livecopy.copy_size(pid) if copy_limit else 0
    expected = expected_copy_s(size)
    if copy_limit and size <= livecopy.bound(copy_limit) and expected > budget_s:
        return LiveScan(pid, skipped=f"scan not started: copying {size / 2**30:.2f} GiB of "
                                     f"writable memory would stop it about {expected:.2f} s,"
                                     f" over the budget of {budget_s:.3f} s")
    pre_copy = soft_dirty() if pre_copy is None else pre_copy
    scan_ioctl = pre_copy and features.current().pagemap_scan is True
    prep = livecopy.prepare(pid, copy_limit, pre_copy, pagemap_scan=scan_ioctl) \
        if copy_limit else "the copy is off (copy_mib=0)"
    if isinstance(prep, str):
        return _scan_stopped(pid, budget_s, objects, f"scanned while stopped: {prep}",
                             (classes or {}, set_aside))
    live = _stopped(pid, lambda: _copy(pid, prep, objects, (classes or {}, set_aside)))
    if live.scan is not None:
        finish(live.scan)  # the graph of what was read: the process runs meanwhile
    return live


def _copy(pid: int, prep: livecopy.Prepared, objects: Callable[[], list[ObjectRecord]],
          classes: Classing) -> Callable[[], LiveScan]:
    """In the stop: the objects, their classes and the copy; what to do once continued."""
    live = LiveScan(pid, objects=objects(), how="soft-dirty" if prep.soft_dirty else "copy")
    _read_classes(live, classes)
    copied = copy_process(prep)

    def after() -> LiveScan:
        if isinstance(copied, str):
            return LiveScan(pid, skipped=f"not scanned: {copied}")
        live.scan = read_copy(copied)
        _keep_classes(live)
        live.copied_bytes, live.recopied_bytes = copied.out.bytes_read, prep.recopied
        return live
    return after


def soft_dirty() -> bool:
    """Whether the running kernel tells the pages written since a clear (the feature
    table: kernel/features.py; REFCNTD_KERNEL_WITHOUT=soft_dirty rules it out)."""
    return features.current().soft_dirty is True


def expected_copy_s(size: int) -> float:
    return SECONDS_PER_SCAN + size / 2**30 * COPY_SECONDS_PER_GIB


def _scan_stopped(pid: int, budget_s: float, objects: Callable[[], list[ObjectRecord]],
                  why: str, classes: Classing) -> LiveScan:
    """Today's scan (before the copy): read while stopped, the kinds made after."""
    expected, size, blocks = estimate_s(pid)
    if expected > budget_s:
        return LiveScan(pid, skipped=f"scan not started: {size / 2**30:.2f} GiB of writable "
                                     f"memory and {blocks:,} malloc blocks would stop it "
                                     f"about {expected:.2f} s, over the budget of "
                                     f"{budget_s:.3f} s ({why})")

    def stopped() -> Callable[[], LiveScan]:
        live = LiveScan(pid, objects=objects(), how="stopped", why=why)
        live.scan = read_process(pid)
        _read_classes(live, classes)
        _keep_classes(live)
        return lambda: live
    live = _stopped(pid, stopped)
    if live.scan is not None:
        finish(live.scan)
    return live


def _read_classes(live: LiveScan, classing: Classing) -> None:
    """While stopped: the class of each of its objects whose type the spec reads; those
    the library flags "may be leaked" set aside, as the flag's probes would."""
    classes, set_aside = classing
    wanted = {o.addr: classes[o.type_name] for o in live.objects
              if o.type_name in classes}
    if wanted:
        found = read_classes(live.pid, wanted)
        live.classes, live.class_notes = found.names, note(found)
        if found.kept and set_aside is not None:
            set_aside(live.pid, found.kept)
            kept = set(found.kept)
            live.objects = [o for o in live.objects if o.addr not in kept]


def _keep_classes(live: LiveScan) -> None:
    """The classes read in the stop, on the scan the report takes."""
    assert live.scan is not None
    live.scan.classes = live.classes
    live.scan.notes += live.class_notes


def _stopped(pid: int, work: Callable[[], Callable[[], LiveScan]]) -> LiveScan:
    """`work` with `pid` stopped (unless it was already), timed; what it returns with
    the process continued."""
    was_stopped = wait_stopped(pid, timeout_s=0)
    began = time.monotonic()
    marker = None if was_stopped else mark_held(pid)
    try:
        if not was_stopped:
            os.kill(pid, signal.SIGSTOP)
            wait_stopped(pid)
        after = work()
    except ProcessLookupError:
        return LiveScan(pid, skipped="gone")
    finally:
        if not was_stopped:
            _continue(pid, marker)
    stopped_s = time.monotonic() - began
    live = after()
    live.stopped_s = stopped_s if live.scan is not None else 0.0
    return live


def _continue(pid: int, marker: Path | None) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    if marker is not None:
        with contextlib.suppress(OSError):
            marker.unlink()


def lost_report(tracer: Tracer, live: LiveScan, show_cmdline: bool) -> ProcessReport:
    """On the tracer's report worker: the lost objects by type and allocation stack."""
    assert live.scan is not None
    tracker, now_ns = tracer.tracker, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    groups = group_leaks(live.objects, tracker.stacks, tracker.sym, now_ns,
                         ProcessModules(perf_map=load_perf_map(live.pid)))
    groups = [g for g in apply_classes(apply_kinds(groups, live.scan, now_ns),
                                       live.scan.classes) if g.kind in LOST]
    command = read_cmdline(live.pid)
    session = tracker.sessions.get(live.pid)
    comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
    notes = list(live.scan.notes) + [stop_note(live)]
    return ProcessReport(live.pid, comm, command if show_cmdline else [], "live",
                         groups=groups, notes=notes)


def stop_note(live: LiveScan) -> str:
    """What the stop was: a copy, the pages written since a copy, or the scan itself."""
    assert live.scan is not None
    mib = live.scan.bytes_read / 2**20
    if live.how == "copy":
        return f"stopped {live.stopped_s:.3f} s to copy {mib:.1f} MiB, scanned once continued"
    if live.how == "soft-dirty":
        return (f"stopped {live.stopped_s:.3f} s to copy {live.recopied_bytes / 2**20:.1f} MiB "
                f"written since a copy of {mib - live.recopied_bytes / 2**20:.1f} MiB made "
                "while it ran (soft-dirty "
                "pages), scanned once continued")
    return f"stopped {live.stopped_s:.3f} s for a scan of {mib:.1f} MiB ({live.why})"
