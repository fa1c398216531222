"""`refcntd serve` on real GStreamer pipelines for a set duration (issue 58 item 6).

    sudo .venv/bin/python benchmarks/gstsoak.py [--minutes 60] [--short] [--out DIR]

Starts `refcntd serve` with one target on Debian's /usr/bin/gst-launch-1.0 (the bundled
gstreamer spec) and Debian's Prometheus scraping /metrics every 5 s, and runs two live
pipelines (benchmarks/gstpipes.py: audio and video), each under GStreamer's own leaks
tracer and restarted every --restart-every minutes (video half a period after audio)
by SIGINT with -e, so it exits normally and gets a report. Each minute: a GET /leaks
live scan, serve's RSS, fds, threads and BPF maps, the scrapes' latency, the /leaks
stop and each pipeline's largest gap between two buffers. Each pipeline run's report
(objects alive at exit, by class) is compared with what the leaks tracer printed at
gst_deinit() in the same process. Results: gst-soak.md/.json.
--short is the CI version (3 minutes, 1 of warm-up, a restart of each pipeline;
tests/bpf/test_gstsoak.py checks its invariants, not its timings).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gstpipes import GST, PIPELINES, Pipeline, alive, leaks_env  # noqa: E402
from gstsoakreport import judge, write  # noqa: E402
from run import machine  # noqa: E402
from soakreport import publish  # noqa: E402
from soakrig import ROOT, Prometheus, ServeProcess, run_soak  # noqa: E402
from soaksample import maps, process  # noqa: E402

TARGET = "gst"
INIT_FRAME = "g_option_context_parse"  # gst_init_check() parses GStreamer's options
REPORT_WAIT_S = 120  # an exit's report on a loaded machine (symbolizing the first one)


class GstServe(ServeProcess):
    def __init__(self, work: Path, program: Path, source: Path = ROOT) -> None:
        self.program = program
        super().__init__(work, max_reports=1000, source=source)

    def targets_yaml(self) -> str:
        return f"  - name: {TARGET}\n    path: {self.program}\n    spec: gstreamer\n"


class Run:
    """One pipeline run under the leaks tracer, and its check against serve's report."""

    def __init__(self, kind: str, n: int, program: Path, work: Path) -> None:
        self.kind, self.n = kind, n
        self.trace = work / f"{kind}-{n}.gsttrace"
        self.pipe = Pipeline(kind, program, leaks_env(self.trace), work / f"{kind}-{n}.gaps")
        self.pid = self.pipe.pid

    def finish(self, serve: GstServe) -> dict:
        """Stop the run and compare: the leaks tracer's objects alive at gst_deinit()
        (after those it listed alive at a SIGUSR1 just before: it reads live objects,
        not only none) with the objects serve's report says are alive at exit."""
        os.kill(self.pid, 10)  # SIGUSR1: the tracer lists the objects alive now
        live = _settled(lambda: sum(alive(self.trace).values()))
        at_usr1 = alive(self.trace)
        code = self.pipe.stop()
        tracer = _settled(lambda: alive(self.trace)) - at_usr1
        report = _wait_report(serve, self.pid)
        out = {"kind": self.kind, "run": self.n, "pid": self.pid, "exit": code,
               "minutes": round((time.monotonic() - self.pipe.started) / 60, 1),
               "buffers": self.pipe.buffers, "tracer_live_at_usr1": live,
               "tracer_at_exit": dict(tracer), "reports": len(report)}
        if len(report) != 1:
            return out | {"exact": False, "why": f"{len(report)} reports"}
        (proc,) = report[0]["processes"]
        complete = report[0]["tracing"]["complete"] and not report[0]["tracing"]["lost"]
        early, later = _by_when(proc["groups"])
        out |= {"refcntd_at_exit": dict(later), "refcntd_in_gst_init": dict(early),
                "state": proc["state"], "kept_by_library": proc["kept_by_library"],
                "complete": complete, "anomalies": len(proc["anomalies"])}
        why = [w for w, bad in (("exit status", code != 0), ("tracer read nothing", not live),
                                ("incomplete", not complete),
                                ("counts differ", sum(later.values()) != sum(tracer.values())))
               if bad]
        return out | {"exact": not why, "why": ", ".join(why)}


def _by_when(groups: list[dict]) -> tuple[Counter[str], Counter[str]]:
    """Objects alive at exit by type: (made inside gst_init(), made after). GStreamer
    starts its tracers at the end of gst_init() (run from g_option_context_parse's
    post-parse hook), so the leaks tracer never sees the first kind: it cannot list
    them, whatever becomes of them."""
    early, later = Counter[str](), Counter[str]()
    for g in groups:
        made_in_init = any(f.get("function") == INIT_FRAME for f in g["stack"])
        (early if made_in_init else later)[g.get("class_name") or g["type"]] += g["objects"]
    return early, later


def _settled(read: object, quiet_s: float = 1.0, timeout: float = 30) -> object:
    """read() once it has stopped changing for `quiet_s` (a file still being written)."""
    last, since, deadline = read(), time.monotonic(), time.monotonic() + timeout  # type: ignore[operator]
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.2)
        now = read()  # type: ignore[operator]
        if now != last:
            last, since = now, time.monotonic()
    return last


def _wait_report(serve: GstServe, pid: int) -> list[dict]:
    deadline = time.monotonic() + REPORT_WAIT_S
    while time.monotonic() < deadline:
        found = [p for p in serve.reports.glob(f"*-{TARGET}-{pid}.json")]
        if found:
            time.sleep(1)  # a second report of the same process would be a fault: wait
            return [json.loads(p.read_text()) for p in serve.reports.glob(
                f"*-{TARGET}-{pid}.json")]
        time.sleep(0.5)
    return []


class GstSoak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.commit = _commit()  # what runs: the tree may move on during the hour
        self.serve = GstServe(work, args.program)
        self.prom = Prometheus(work, self.serve.port)
        self.runs = {k: Run(k, 1, args.program, work) for k in PIPELINES}
        self.checked: list[dict] = []
        self.rows: list[dict] = []
        self.errors: list[str] = []
        self.start = time.monotonic()

    def run(self) -> None:
        for minute in range(1, self.args.minutes + 1):
            time.sleep(max(0.0, self.start + 60 * minute - time.monotonic()))
            row = {"minute": minute, "events": []} | self._sample()
            if minute < self.args.minutes:
                self._restarts(minute, row)
            self.rows.append(row)
            print(json.dumps(row), flush=True)

    def _restarts(self, minute: int, row: dict) -> None:
        every = self.args.restart_every
        for i, kind in enumerate(sorted(PIPELINES, reverse=True)):  # video, then audio
            offset = every // 2 if i == 0 else 0
            if (minute - offset) % every == 0 and minute >= offset:
                done = self._guarded(f"{kind} restart", lambda k=kind: self.runs[k].finish(
                    self.serve), {"kind": kind, "exact": False, "why": "check failed"})
                self.checked.append(done)
                n = self.runs[kind].n
                self.runs[kind] = Run(kind, n + 1, self.args.program, self.work)
                row["events"].append(f"{kind} run {n} "
                                     f"{'exact' if done['exact'] else 'NOT exact'}")

    def _guarded(self, what: str, fn: object, failed: dict) -> dict:
        try:
            return dict(fn())  # type: ignore[operator]
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            self.errors.append(f"minute {len(self.rows) + 1} {what}: {err}")
            return failed

    def _sample(self) -> dict:
        pid = self.serve.proc.pid
        row: dict = {"t_s": round(time.monotonic() - self.start, 1), "load": os.getloadavg()[0]}
        row |= self._guarded("/leaks", self._leaks, {"leaks": None})
        row |= {"process": process(pid), "bpf": maps(pid), "metrics": self._metrics()}
        row["gaps_ms"] = {k: r.pipe.take_gap() for k, r in self.runs.items()}
        row["pipeline_alive"] = {k: r.pipe.proc.poll() is None for k, r in self.runs.items()}
        q = 'max_over_time(scrape_duration_seconds{job="refcntd"}[1m])'
        scrape = self.prom.scalar(q)
        row["scrape_max_ms"] = None if scrape is None else round(scrape * 1000, 1)
        row["up_min"] = self.prom.scalar('min_over_time(up{job="refcntd"}[1m])')
        row["scrapes"] = self.prom.scalar(
            'count_over_time(scrape_duration_seconds{job="refcntd"}[1m])')
        return row

    def _leaks(self) -> dict:
        """GET /leaks: each pipeline scanned once, what it found lost, the longest stop."""
        took, body = self.serve.http.get("/leaks", 120)
        answer = json.loads(body)["targets"].get(TARGET, {})
        ours = {r.pid: k for k, r in self.runs.items()}
        scans = [s for s in answer.get("scans", []) if s["pid"] in ours]
        lost = sum(p["leaked_objects"] for p in answer.get("run", {}).get("processes", [])
                   if p["pid"] in ours)
        return {"leaks": {"ms": round(took * 1000, 1), "lost": lost,
                          "scanned": sorted(ours[s["pid"]] for s in scans),
                          "skipped": [s["skipped"] for s in scans if s["skipped"]],
                          "stop_ms": max((round(s["stopped_s"] * 1000, 1) for s in scans),
                                         default=None),
                          "others": len(answer.get("scans", [])) - len(scans)}}

    def _metrics(self) -> dict:
        from prometheus_client.parser import text_string_to_metric_families
        text = self.serve.http.get("/metrics")[1].decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name.removesuffix("_total").removeprefix("refcntd_")
                if name in ("dropped_records", "anomalies", "traced_processes",
                            "report_errors", "processes_reported"):
                    out[name] = out.get(name, 0) + s.value
                elif name in ("live_objects", "live_objects_older_than_threshold"):
                    out[f"{name} {s.labels['type']}"] = s.value
                elif name == "live_objects_by_class":
                    out["class_series"] = out.get("class_series", 0) + 1
        return out

    def finish(self) -> dict:
        for kind, r in self.runs.items():
            self.checked.append(self._guarded(f"{kind} last run", lambda r=r: r.finish(
                self.serve), {"kind": kind, "exact": False, "why": "check failed"}))
        end = {"runs": self.checked, "errors": self.errors, "machine": machine(),
               "commit": self.commit,
               "others": self._others(), "serve_exit": self.serve.stop()}
        self.prom.stop()
        return end

    def _others(self) -> int:
        """Reports of gst-launch-1.0 processes this soak did not start (other users')."""
        ours = {r["pid"] for r in self.checked if "pid" in r}
        return sum(1 for p in self.serve.reports.glob(f"*-{TARGET}-*.json")
                   if int(p.stem.rsplit("-", 1)[1]) not in ours)


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                         capture_output=True, text=True)
    return out.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10,
                        help="minutes before RSS is judged (each pipeline restarted once)")
    parser.add_argument("--restart-every", type=int, default=10)
    parser.add_argument("--program", type=Path, default=GST)
    parser.add_argument("--short", action="store_true", help="the CI version")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="gst-soak")
    parser.add_argument("--work", type=Path, help="keep the work files here")
    parser.add_argument("--from-raw", type=Path, help="judge a finished run's raw.json again")
    parser.add_argument("--cost", type=Path, action="append",
                        help="a gstcost.py result to show on the page (again for more)")
    args = parser.parse_args()
    if args.short:
        args.minutes, args.warmup, args.restart_every = 3, 1, 2
    if args.from_raw:
        raw = json.loads(args.from_raw.read_text())
        return publish(args, raw["rows"], raw["end"], judge, write)
    # SIGTERM (and SIGINT, ignored in a background job) stop it as Ctrl-C would: the
    # pipelines and serve stopped, what ran judged and written
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.default_int_handler)
    rows, end = run_soak(args.work, "gstsoak-", lambda work: GstSoak(args, work))
    return publish(args, rows, end, judge, write)


if __name__ == "__main__":
    sys.exit(main())
