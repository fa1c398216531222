"""Checkpoints and diffs: "what is growing?" in processes that never exit.

A checkpoint is a moment (the kernel's monotonic clock, which stamps every
object's init), given to each tracer's kernel side.  From then on the kernel
counts, per process and allocation site, the objects created since that are
still live, with their mean creation time; a diff reads those counts: O(sites),
whatever the number of objects.  `serve` and `attach --listen` answer the same
HTTP routes (POST /checkpoint, GET /diff, GET /live) through `Views`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from refcntd.analysis.leaks import group_sites
from refcntd.analysis.model import ProcessSites
from refcntd.kernel.abi import Stat
from refcntd.kernel.records import SiteLive
from refcntd.outputs import report, reportjson
from refcntd.outputs.folded import folded_sites
from refcntd.session.lifecycle import read_cmdline
from refcntd.session.tracer import Tracer

log = logging.getLogger("refcntd")
Route = Callable[[str, str], tuple[str, str, bytes]]  # (method, query) -> status, type, body


@dataclass(frozen=True)
class Checkpoint:
    at_ns: int  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
    wall: float  # time.time() of the same moment, for people


def now() -> Checkpoint:
    return Checkpoint(time.clock_gettime_ns(time.CLOCK_MONOTONIC), time.time())


class Views:
    """The checkpoint and the per-site views of a set of tracers, by target name.

    `tracers()` is called under `lock`, which keeps them attached while their maps
    are read (a target change waits; capture does not)."""

    def __init__(self, tracers: Callable[[], dict[str, list[Tracer]]],
                 lock: AbstractContextManager[object], show_cmdline: bool = False) -> None:
        self.tracers, self.lock = tracers, lock
        self.show_cmdline = show_cmdline  # read as root: hidden unless the config shows it
        self.checkpoint: Checkpoint | None = None

    def mark(self) -> Checkpoint:
        """A checkpoint for every tracer (SIGUSR1, POST /checkpoint)."""
        cp = now()
        with self.lock:
            self.checkpoint = cp
            for tracers in self.tracers().values():
                for tracer in tracers:
                    tracer.kernel.site_maps.set_checkpoint(cp.at_ns)
        log.info("checkpoint at %s", time.strftime("%H:%M:%S", time.localtime(cp.wall)))
        return cp

    def adopt(self, tracer: Tracer) -> None:
        """A tracer attached after the checkpoint counts from it too."""
        if self.checkpoint is not None:
            tracer.kernel.site_maps.set_checkpoint(self.checkpoint.at_ns)

    def json(self, since: bool) -> dict[str, object]:
        """Per target and process, the objects created since the checkpoint (`since`,
        GET /diff) or every live object (GET /live), by allocation site."""
        if since and self.checkpoint is None:
            return {"checkpoint": None, "targets": {}}
        views = self._read(since)
        out: dict[str, object] = {"checkpoint": self.checkpoint.wall} if since and \
            self.checkpoint else {}
        out["targets"] = {name: [reportjson.sites_json(p, since) for _, ps in v for p in ps]
                          for name, v in views.items()}
        out["not_counted"] = {name: sum(_lost(tr) for tr, _ in v) for name, v in views.items()}
        return out

    def text(self, since: bool, folded: bool = False) -> str:
        if since and self.checkpoint is None:
            return "refcntd: no checkpoint yet (POST /checkpoint or SIGUSR1)\n"
        views = self._read(since)
        if folded:
            return folded_sites([p for v in views.values() for _, ps in v for p in ps], since)
        parts = []
        for name, v in views.items():
            lost = sum(_lost(tr) for tr, _ in v)
            parts.append(f"target {name}:\n" + "".join(
                report.render_sites(p, since) + "\n" for _, ps in v for p in ps) + (
                f"INCOMPLETE: {lost} objects not counted per allocation site (site table "
                "full)\n" if lost else ""))
        return "".join(parts)

    def routes(self, enable_checkpoint: bool = False) -> dict[str, Route]:
        """POST /checkpoint (only when enabled: it changes state, so a local user or a
        web page must not reach it by default); GET /diff and GET /live: JSON,
        ?format=text, ?format=folded."""
        def mark(method: str, _query: str) -> tuple[str, str, bytes]:
            if not enable_checkpoint:
                return ("403 Forbidden", "text/plain", b"POST /checkpoint is off: set "
                        b"web.enable_checkpoint (serve) or --web-enable-checkpoint (attach); "
                        b"SIGUSR1 always sets one\n")
            if method != "POST":
                return "405 Method Not Allowed", "text/plain", b"POST to set a checkpoint\n"
            cp = self.mark()
            return "200 OK", "application/json", json.dumps({"checkpoint": cp.wall}).encode()

        def view(since: bool) -> Route:
            def answer(_method: str, query: str) -> tuple[str, str, bytes]:
                text = "text/plain; charset=utf-8"
                if "format=text" in query:
                    return "200 OK", text, self.text(since).encode()
                if "format=folded" in query:
                    return "200 OK", text, self.text(since, folded=True).encode()
                body = json.dumps(self.json(since), indent=2).encode()
                return "200 OK", "application/json", body
            return answer
        from refcntd.service import leakscan  # GET /leaks
        from refcntd.service.liveviews import routes  # GET /debug/pprof/refcount, /report.html
        return {"/checkpoint": mark, "/diff": view(True), "/live": view(False), **routes(self),
                **leakscan.routes(self, enable_checkpoint)}

    def _read(self, since: bool) -> dict[str, list[tuple[Tracer, list[ProcessSites]]]]:
        with self.lock:
            return {name: [(tr, sites(tr, since, self.show_cmdline)) for tr in tracers]
                    for name, tracers in self.tracers().items()}


def sites(tracer: Tracer, since: bool, show_cmdline: bool = True) -> list[ProcessSites]:
    """Per process, its live objects (`since`: created since the tracer's checkpoint)
    by (type, allocation stack); built on the tracer's report worker, the one thread
    that uses its symbolizer."""
    return tracer.worker.call(lambda: _sites(tracer, since, show_cmdline))


def _lost(tracer: Tracer) -> int:
    """Objects the kernel could not count per site (its site table was full)."""
    return tracer.kernel.stats().get(Stat.ALLOC_SITES_FULL, 0)


def _sites(tracer: Tracer, since: bool, show_cmdline: bool) -> list[ProcessSites]:
    by_pid: dict[int, list[SiteLive]] = {}
    for site in tracer.kernel.site_maps.site_lives():
        by_pid.setdefault(site.tgid, []).append(site)
    tracker, now_ns = tracer.tracker, time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    out = []
    for pid, found in sorted(by_pid.items()):
        groups = group_sites(found, tracker.stacks, tracker.sym, now_ns, since)
        if not groups:
            continue
        command = read_cmdline(pid)
        session = tracker.sessions.get(pid)
        comm = session.comm if session else (command[0].rsplit("/", 1)[-1] if command else "")
        out.append(ProcessSites(pid, comm, command if show_cmdline else [], groups))
    return out
