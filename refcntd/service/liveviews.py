"""`GET /debug/pprof/refcount` and `GET /report.html` on `serve` and `attach --listen`.

Both show every live object now, by process, type and allocation stack: the
pprof profile of `outputs/pprof.py` (for Parca, Grafana Alloy and Pyroscope, `go
tool pprof URL`) and the page of `outputs/html.py`.  Unlike /metrics and /live,
which read the kernel's per-site counters, they read every live object once (its
count and age are not counted per site): O(objects), on each tracer's report
worker, the one thread that uses its symbolizer (docs/profiles.md has the cost).

Query parameters: `target=NAME` and `type=NAME` (each may repeat) keep only those
targets and object types; `seconds` is accepted and ignored (a scraper's delta
mode adds it: these profiles are snapshots, scrape them with delta off).  Any
other parameter is refused with 400, so a typo does not silently show everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from refcntd.analysis.leaks import ProcessModules, group_leaks
from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.kernel.records import ObjectRecord
from refcntd.outputs import pprof
from refcntd.outputs.html import render_html
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.tracer import Tracer, probe_statuses
from refcntd.symbolize.perfmap import load_perf_map

if TYPE_CHECKING:
    from refcntd.service.checkpoint import Route, Views

STATE_LIVE = "live"
PARAMETERS = ("target", "type", "seconds")
Answer = tuple[str, str, bytes]


class _BadQuery(Exception):
    pass


def routes(views: Views) -> dict[str, Route]:
    return {"/debug/pprof/refcount": _route(views, _profile),
            "/report.html": _route(views, _page)}


def _route(views: Views, render: Callable[[list[RunResult]], Answer]) -> Route:
    def answer(method: str, query: str) -> Answer:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        try:
            targets, types = _parse(query)
            return render(live_results(views, targets, types))
        except _BadQuery as err:
            return "400 Bad Request", "text/plain; charset=utf-8", f"{err}\n".encode()
    return answer


def _profile(results: list[RunResult]) -> Answer:
    return "200 OK", pprof.CONTENT_TYPE, pprof.run_profile(results, time_ns=time.time_ns(),
                                                            live=True)


def _page(results: list[RunResult]) -> Answer:
    return "200 OK", "text/html; charset=utf-8", render_html(results, live=True).encode()


def _parse(query: str) -> tuple[set[str] | None, set[str] | None]:
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query),
                          max_num_fields=100)
    except ValueError as err:
        raise _BadQuery(f"bad query string: {err}") from None
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise _BadQuery(f"unknown query parameter {unknown[0]!r} (known: "
                        f"{', '.join(PARAMETERS)})")
    return (set(params["target"]) if "target" in params else None,
            set(params["type"]) if "type" in params else None)


def live_results(views: Views, targets: set[str] | None = None,
                 types: set[str] | None = None) -> list[RunResult]:
    """One RunResult per target (all, or `targets`), each process's live objects by
    type and allocation stack (only `types`, when given)."""
    with views.lock:
        by_target = views.tracers()
        missing = sorted((targets or set()) - set(by_target))
        if missing:
            raise _BadQuery(f"no target {missing[0]!r} (targets: {', '.join(sorted(by_target))})")
        out = []
        for name, tracers in sorted(by_target.items()):
            if targets is not None and name not in targets:
                continue
            result = RunResult(STATE_LIVE, "", name)
            for tracer in tracers:
                result.spec = tracer.plan.spec.name
                result.tracing.probes += probe_statuses(tracer.plan, [])
                result.processes += tracer.worker.call(
                    partial(live_processes, tracer, views.show_cmdline, types))
            out.append(result)
    return out


def live_processes(tracer: Tracer, show_cmdline: bool,
                   types: set[str] | None = None) -> list[ProcessReport]:
    """Every live object of the tracer's processes, read once from the kernel's object
    map (not drained): run on the tracer's report worker."""
    by_pid: dict[int, list[ObjectRecord]] = {}
    for rec in tracer.kernel.live_objects():
        by_pid.setdefault(rec.tgid, []).append(rec)
    tracker, now_ns = tracer.tracker, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for pid, records in sorted(by_pid.items()):
        mods = ProcessModules(perf_map=load_perf_map(pid))
        groups = [g for g in group_leaks(records, tracker.stacks, tracker.sym, now_ns, mods)
                  if types is None or g.type_name in types]
        if not groups:
            continue
        command = read_cmdline(pid)
        session = tracker.sessions.get(pid)
        comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
        out.append(ProcessReport(pid, comm, command if show_cmdline else [], STATE_LIVE,
                                 groups=groups))
    return out
