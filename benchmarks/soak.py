"""`refcntd serve` for a set duration of churn, upgrades, reloads and scrapes (issue 43).

    sudo .venv/bin/python benchmarks/soak.py [--minutes 60] [--short] [--out DIR]

Starts `refcntd serve` (targets gen, genlib, svc, and extra by reload) and Debian's
Prometheus scraping /metrics every 5 s, then drives for --minutes: about --rate
short-lived processes a minute (benchmarks/soakgen.c: each leaks a known set and
prints it; some fork, some exec, some are killed), a long-running service (svc)
checkpointed and diffed each minute, gen rebuilt in place (a new build-id) every
--upgrade-every minutes, extra added or removed by SIGHUP every --reload-every.
Each minute the churn pauses until its processes are gone and reported, and the
soak records serve's RSS, fds, threads, BPF maps (entries, memlock), drops, scrape
latency and whether every report equals its process's truth: soak.md/.json.
--short is the CI version (3 minutes, 1 of warm-up, an upgrade and a reload each
minute; tests/bpf/test_soak.py checks its invariants, not its timings).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from soakload import Checker, Churn  # noqa: E402
from soakreport import SCRAPE_GOAL_MS, SVC_REQUESTS, judge, publish, write  # noqa: E402
from soakrig import Binaries, Prometheus, Serve, build_id, run_soak  # noqa: E402
from soaksample import maps, process  # noqa: E402

MIN_CHURN_S = 40  # requests (one leaked conn each) between a checkpoint and its diff


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.bins = Binaries(work / "bin")
        self.serve = Serve(work, self.bins, max_reports=5000)
        self.prom = Prometheus(work, self.serve.port)
        self.svc = subprocess.Popen([str(self.bins.svc), "svc"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        self.svc_total = 0
        self.churn = Churn(self._programs(), args.rate)
        self.checker = Checker(self.serve.reports, self.churn)
        self.rows: list[dict] = []
        self.errors: list[str] = []  # what failed in a minute's checks, with the minute
        self.start = time.monotonic()

    def _programs(self) -> dict[str, Path]:
        progs = {"gen": self.bins.gen, "genlib": self.bins.genlib}
        return progs | ({"extra": self.bins.extra} if self.serve.extra else {})

    def run(self) -> None:
        next_at = self.start + 60
        for minute in range(1, self.args.minutes + 1):
            self._until(next_at)
            self.churn.pause()
            self.checker.settle()
            row = {"minute": minute, "events": [], "extra": self.serve.extra,
                   "svc_live_at_sample": self.svc_total}
            row |= self._sample()
            row |= self._guarded("svc diff", self._svc_diff, {"svc_diff_conns": None})
            self._guarded("events", partial(self._events, minute, row), {})
            self.rows.append(row)
            print(json.dumps(row), flush=True)
            self.churn.resume()
            # a minute's checks can take long on a loaded machine: the churn still gets
            # at least MIN_CHURN_S before the next (the run then lasts longer)
            next_at = max(next_at + 60, time.monotonic() + MIN_CHURN_S)

    def _guarded(self, what: str, fn: object, failed: dict) -> dict:
        """fn()'s fields; a failure (a timed-out request, an attach never seen) is kept
        in `errors` and judged at the end instead of stopping an hour's run."""
        try:
            return dict(fn() or {})  # type: ignore[operator]
        except (OSError, RuntimeError, ValueError) as err:
            self.errors.append(f"minute {len(self.rows) + 1} {what}: {err}")
            return failed

    def _until(self, when: float) -> None:
        while time.monotonic() < when:
            time.sleep(min(2.0, max(0.0, when - time.monotonic())))
            self.checker.scan()

    def _sample(self) -> dict:
        pid = self.serve.proc.pid
        try:
            pprof_s, body = self.serve.http.get("/debug/pprof/refcount", 120)
            gzip.decompress(body)  # a valid profile
            pprof_ms: float | None = round(pprof_s * 1000, 1)
        except OSError as err:  # shown in the row and judged, the soak goes on
            pprof_ms, self.errors = None, [*self.errors, f"pprof: {err}"]
        scrape = self.prom.scalar('max_over_time(scrape_duration_seconds{job="refcntd"}[1m])')
        up = self.prom.scalar('min_over_time(up{job="refcntd"}[1m])')
        slow = self.prom.scalar('count_over_time((scrape_duration_seconds{job="refcntd"} '
                                f'> {SCRAPE_GOAL_MS / 1000})[1m:5s])')
        scrapes = self.prom.scalar('count_over_time(scrape_duration_seconds{job="refcntd"}[1m])')
        # serve's own garbage-collector pauses over 100 ms this minute (all generations)
        bucket = 'sum(increase(refcntd_gc_pause_seconds_bucket{{le="{}"}}[1m]))'
        long_gc = self.prom.scalar(f'{bucket.format("+Inf")} - {bucket.format("0.1")}')
        with self.churn.lock:
            launched, failed = self.churn.launched, len(self.churn.failed)
        return {"process": process(pid), "bpf": maps(pid), "metrics": self._metrics(),
                "scrape_max_ms": None if scrape is None else round(scrape * 1000, 1),
                "up_min": up, "pprof_ms": pprof_ms, "scrapes": scrapes,
                "slow_scrapes": slow or 0, "long_gc_pauses": round(long_gc or 0),
                "launched": launched, "launch_failed": failed, "exact": self.checker.exact,
                "wrong": len(self.checker.wrong), "incomplete": len(self.checker.incomplete),
                "missing": len(self.checker.missing()),
                "load": os.getloadavg()[0], "t_s": round(time.monotonic() - self.start, 1)}

    def _metrics(self) -> dict:
        from prometheus_client.parser import text_string_to_metric_families
        text = self.serve.http.get("/metrics")[1].decode()
        out: dict[str, float] = {}
        keep = ("refcntd_dropped_records", "refcntd_anomalies", "refcntd_traced_processes",
                "refcntd_report_errors", "refcntd_processes_reported",
                "refcntd_gc_unscheduled_pauses")
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.removesuffix("_total") in keep:
                    key = s.name.removesuffix("_total")
                    out[key] = out.get(key, 0) + s.value
                elif s.name == "refcntd_map_entries":
                    key = f"entries_{s.labels['target']}_{s.labels['map']}"
                    out[key] = s.value
        return out

    def _svc_diff(self) -> dict:
        """A checkpoint, SVC_REQUESTS leaking requests, a diff: exactly that many conns."""
        self.serve.http.post("/checkpoint")
        assert self.svc.stdin is not None and self.svc.stdout is not None
        self.svc.stdin.write(f"{SVC_REQUESTS}\n")
        self.svc.stdin.flush()
        self.svc_total = int(self.svc.stdout.readline().split()[1])
        time.sleep(0.2)
        diff = self.serve.http.json("/diff")
        conns = sum(g["objects"] for p in diff["targets"].get("svc", [])
                    for g in p["groups"] if g["type"] == "conn")
        return {"svc_diff_conns": conns, "svc_live": self.svc_total}

    def _events(self, minute: int, row: dict) -> None:
        a = self.args
        if minute % a.upgrade_every == 0 and minute < a.minutes:
            self.bins.upgrade()
            bid = build_id(self.bins.gen)
            row["events"].append(f"upgrade gen build {self.bins.build} "
                                 f"({self.serve.wait_build('gen', bid):.1f} s to re-attach)")
        if minute % a.reload_every == 0 and minute < a.minutes:
            on = not self.serve.extra
            took = self.serve.set_extra(on)
            self.churn.set_programs(self._programs())
            row["events"].append(f"reload: extra {'added' if on else 'removed'} ({took:.1f} s)")

    def finish(self) -> dict:
        """Stop the churn and the service, collect the last reports, stop serve."""
        self.churn.stop()
        self.svc.kill()
        self.svc.wait()
        with self.churn.lock:  # the service's one report: every conn it leaked, count 1
            self.churn.truth[("svc", self.svc.pid)] = [{"conn": [1] * self.svc_total}]
        self.checker.settle(60)
        end = {"failed": self.churn.failed[:20], "wrong": self.checker.wrong[:20],
               "incomplete": self.checker.incomplete[:20],
               "unexpected": self.checker.unexpected[:20], "missing": self.checker.missing()[:20],
               "exact": self.checker.exact, "launched": self.churn.launched,
               "resets": self._resets(), "errors": self.errors}
        end["serve_exit"] = self.serve.stop()
        self.prom.stop()
        return end

    def _resets(self) -> list[dict]:
        """Counter series that went down at least once over the soak (a removed and
        re-added target starts again: extra is left out)."""
        span = int(time.monotonic() - self.start) + 60
        expr = f'resets({{job="refcntd",__name__=~".+_total",target!="extra"}}[{span}s]) > 0'
        return [{"series": r["metric"], "resets": r["value"][1]} for r in self.prom.query(expr)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rate", type=float, default=1000, help="processes a minute")
    parser.add_argument("--upgrade-every", type=int, default=10)
    parser.add_argument("--reload-every", type=int, default=7)
    parser.add_argument("--short", action="store_true", help="the CI version")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="soak")
    parser.add_argument("--work", type=Path, help="keep the work files here")
    parser.add_argument("--from-raw", type=Path, help="judge a finished run's raw.json again "
                        "(with the options it ran with) and write its page")
    args = parser.parse_args()
    if args.short:
        args.minutes, args.warmup, args.upgrade_every, args.reload_every = 3, 1, 1, 1
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        return publish(args, raw["rows"], raw["end"], judge, write)
    rows, end = run_soak(args.work, "soak-", lambda work: Soak(args, work))
    return publish(args, rows, end, judge, write)


if __name__ == "__main__":
    sys.exit(main())
