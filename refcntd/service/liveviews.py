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
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, overload
from urllib.parse import parse_qs

from refcntd.analysis.leaks import ProcessModules, group_leaks
from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.kernel.columns import LiveSite
from refcntd.outputs import pprof
from refcntd.outputs.html import render_html
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.status import probe_statuses
from refcntd.session.tracer import Tracer
from refcntd.symbolize.perfmap import load_perf_map

if TYPE_CHECKING:
    from refcntd.service.checkpoint import Route, Views

STATE_LIVE = "live"
MAX_SHOWN = 50  # objects kept per allocation site for the page (html.MAX_OBJECTS)
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
    map (not drained) as columns and counted per allocation site; only the first
    MAX_SHOWN of each site become records.  Run on the tracer's report worker."""
    now_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    by_pid: dict[int, list[LiveSite]] = {}
    for site in tracer.kernel.objects.live_sites(now_ns, MAX_SHOWN):
        by_pid.setdefault(site.tgid, []).append(site)
    out = []
    for pid, sites in sorted(by_pid.items()):
        groups = [g for g in _groups(tracer, pid, sites, now_ns)
                  if types is None or g.type_name in types]
        if groups:
            out.append(_process(tracer, pid, groups, show_cmdline))
    return out


def _groups(tracer: Tracer, pid: int, sites: list[LiveSite], now_ns: int) -> list[LeakGroup]:
    """Symbolized and grouped like a report, from the objects kept; each group then
    counts every object of its sites (two sites may symbolize alike)."""
    site_of = {rec.addr: site for site in sites for rec in site.shown}
    tracker = tracer.tracker
    groups = group_leaks([rec for site in sites for rec in site.shown],
                         tracker.stacks, tracker.sym, now_ns,
                         ProcessModules(perf_map=load_perf_map(pid)))
    for g in groups:
        mine = list({id(site_of[o.address]): site_of[o.address] for o in g.objects}.values())
        g.objects = SummedObjects(g.objects[:MAX_SHOWN], sum(s.objects for s in mine),
                                  sum(s.references for s in mine),
                                  sum(s.age_ns for s in mine))  # type: ignore[assignment]
    return sorted(groups, key=LeakGroup.order)


def _process(tracer: Tracer, pid: int, groups: list[LeakGroup],
             show_cmdline: bool) -> ProcessReport:
    command = read_cmdline(pid)
    session = tracer.tracker.sessions.get(pid)
    comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
    return ProcessReport(pid, comm, command if show_cmdline else [], STATE_LIVE,
                         groups=groups)


class SummedObjects(Sequence[LeakedObject]):
    """A live group's objects: every one counted (len, sums()), the first MAX_SHOWN kept
    for the page to list (indexing reaches only those)."""

    without_ownership = True  # no held_by or cycles: history is not read for live objects

    def __init__(self, shown: list[LeakedObject], n: int, references: int,
                 age_ns: int) -> None:
        self.shown, self.n, self.references, self.age_ns = shown, n, references, age_ns

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> LeakedObject: ...
    @overload
    def __getitem__(self, i: slice) -> list[LeakedObject]: ...

    def __getitem__(self, i: int | slice) -> LeakedObject | list[LeakedObject]:
        return self.shown[i]

    def sums(self) -> tuple[int, int]:
        return self.references, self.age_ns
