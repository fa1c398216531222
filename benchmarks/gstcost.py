"""What tracing costs a GStreamer pipeline (issue 58 item 7): CPU ticks per window of
the audio and video pipelines (benchmarks/gstpipes.py) and of serve, in four arms
alternated in the same minutes.

    sudo .venv/bin/python benchmarks/gstcost.py [--rounds 6] [--window 30]
        [--serve-config W/refcntd.yaml] [--out DIR]

Arms: `untraced` (a copy of gst-launch-1.0 on private copies of the two probed
libraries, through LD_LIBRARY_PATH: another inode, so no uprobe fires), `probed` (the
copy on the system's libraries: serve's uprobes fire and its BPF program finds a
process no target has: the floor any process mapping libgstreamer pays while serve
runs), `traced` (/usr/bin/gst-launch-1.0, serve's target) and `leaks` (the untraced
copy under GStreamer's own leaks tracer, GST_TRACERS=leaks, nothing logged until exit).
Each window also reads serve's BPF programs' run counts and run time (fdinfo, with
kernel.bpf_stats_enabled=1 for the measurement) and its operation counters (/metrics),
so probe hits per second and BPF ns per probe run stand beside the ticks. With
--serve-config it measures against a running serve (the gst soak's: its pipelines'
own probe hits are the background, read in the untraced windows), else starts its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gstpipes import GST, PIPELINES, Pipeline, cpu_ticks, private_libs  # noqa: E402
from run import machine  # noqa: E402
from soakrig import Http  # noqa: E402

ARMS = ("untraced", "probed", "traced", "leaks")
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
SPEC = HERE.parent / "configs" / "specs" / "gstreamer.yaml"
PLUGINS = "/usr/lib/x86_64-linux-gnu/gstreamer-1.0"
SCANNER = "/usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner"


class Serve:
    """The serve measured against: a running one (its config) or one of our own."""

    def __init__(self, work: Path, config: Path | None, source: Path | None = None) -> None:
        """`source`: the tree whose refcntd serves when it starts its own (default this)."""
        self.own = None
        self._names: dict[int, str] = {}
        if config is None:
            from gstsoak import GstServe
            self.own = GstServe(work, GST, *(() if source is None else (source,)))
            config = self.own.config
        text = config.read_text()
        port = int(text.split("listen: ", 1)[1].split("\n", 1)[0].rsplit(":", 1)[1])
        self.program = Path(text.split("path: ", 1)[1].split("\n", 1)[0])  # its target
        self.http = Http(port)
        self.pid = self.own.proc.pid if self.own else _pid_of(config)

    def progs(self) -> dict[str, tuple[int, int]]:
        """(run count, run ns) of serve's BPF programs, summed by name (on_probe: every
        uprobe; the tracepoints' names cut at 15 characters)."""
        out: dict[str, tuple[int, int]] = {}
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                if os.readlink(f"/proc/{self.pid}/fd/{fd}") != "anon_inode:bpf-prog":
                    continue
                info = dict(line.split(":", 1) for line in
                            Path(f"/proc/{self.pid}/fdinfo/{fd}").read_text().splitlines()
                            if ":" in line)
            except OSError:
                continue
            name = self._name(int(info["prog_id"]))
            runs, ns = out.get(name, (0, 0))
            out[name] = (runs + int(info.get("run_cnt", 0)), ns + int(info.get("run_time_ns", 0)))
        return out

    def _name(self, prog_id: int) -> str:
        if prog_id not in self._names:
            shown = json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "id",
                                               str(prog_id)], capture_output=True,
                                              text=True, check=True).stdout)
            self._names[prog_id] = str(shown.get("name", prog_id))
        return self._names[prog_id]

    def counters(self) -> dict[str, float]:
        """Operations by type and kernel notes, summed over targets."""
        from prometheus_client.parser import text_string_to_metric_families
        out: dict[str, float] = {}
        text = self.http.get("/metrics")[1].decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "refcntd_operations_total":
                    key = f"{s.labels['type']} {s.labels['operation']}"
                elif s.name == "refcntd_kernel_notes_total":
                    key = f"note {s.labels['note']}"
                else:
                    continue
                out[key] = out.get(key, 0) + s.value
        return out

    def stop(self) -> None:
        if self.own:
            self.own.stop()


def _pid_of(config: Path) -> int:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmd and str(config).encode() in cmd:
            return int(pid)
    raise RuntimeError(f"no refcntd serve running with {config}")


def arm_setup(work: Path, target: Path) -> dict[str, tuple[Path, dict[str, str]]]:
    """Program and environment of each arm (`target`: serve's)."""
    copy = work / "bin" / "gst-launch-1.0"
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(GST, copy)
    # GStreamer finds its plugins and scanner beside the libgstreamer it runs: the system's
    # named, and a registry of its own (the system's cache is never rewritten from here)
    libs = {"LD_LIBRARY_PATH": str(private_libs(work / "lib")),
            "GST_REGISTRY": str(work / "registry.bin"), "GST_PLUGIN_SYSTEM_PATH": PLUGINS,
            "GST_PLUGIN_SCANNER": SCANNER}
    return {"untraced": (copy, libs), "probed": (copy, {}), "traced": (target, {}),
            "leaks": (copy, libs | {"GST_TRACERS": "leaks"})}


def probed_functions() -> dict[str, list[str]]:
    """library soname -> the functions the bundled gstreamer spec probes in it."""
    import yaml
    spec = yaml.safe_load(SPEC.read_text())
    out: dict[str, list[str]] = {}
    for entries in spec["roles"].values():
        for role in entries if isinstance(entries, list) else [entries]:
            lib = role.get("library", spec["library"])
            out.setdefault(lib, []).extend(role["functions"])
    return out


def calls(program: Path, seconds: float, warm: float) -> dict[str, dict[str, float]]:
    """Calls per second of each probed function in each pipeline, counted by perf's own
    uprobes on that one process (perf stat -p): the probe hits serve's tracing pays."""
    events = []
    for lib, functions in probed_functions().items():
        path = f"/usr/lib/x86_64-linux-gnu/{lib}"
        added = subprocess.run(["perf", "probe", "-q", "-x", path, *sum(
            (["-a", f] for f in functions), [])], capture_output=True, text=True)
        if added.returncode:
            raise RuntimeError(f"perf probe {lib}: {added.stderr.strip()}")
        events += [f"probe_{lib.split('-')[0].split('.')[0]}:{f}" for f in functions]
    out = {}
    try:
        for kind in PIPELINES:
            pipe = Pipeline(kind, program)
            try:
                time.sleep(warm)
                stat = subprocess.run(["perf", "stat", "-x,", "-e", ",".join(events), "-p",
                                       str(pipe.pid), "--", "sleep", str(seconds)],
                                      capture_output=True, text=True, check=True).stderr
            finally:
                pipe.stop()
            out[kind] = {line.split(",")[2].split(":")[1]: round(float(line.split(",")[0])
                                                                 / seconds, 1)
                         for line in stat.splitlines() if line.count(",") > 2}
    finally:
        subprocess.run(["perf", "probe", "-q", "-d", "probe_libgstreamer:*", "-d",
                        "probe_libgobject:*"], capture_output=True)
    return out


def window(serve: Serve, arm: str, setup: tuple[Path, dict[str, str]], warm: float,
           length: float) -> dict:
    pipes = {k: Pipeline(k, setup[0], setup[1]) for k in PIPELINES}
    try:
        time.sleep(warm)
        private = all(str(setup[1].get("LD_LIBRARY_PATH", "-")) in
                      Path(f"/proc/{p.pid}/maps").read_text() for p in pipes.values())
        t0, s0 = {k: cpu_ticks(p.pid) for k, p in pipes.items()}, cpu_ticks(serve.pid)
        p0, c0, start = serve.progs(), serve.counters(), time.monotonic()
        time.sleep(length)
        t1, s1 = {k: cpu_ticks(p.pid) for k, p in pipes.items()}, cpu_ticks(serve.pid)
        p1, c1, took = serve.progs(), serve.counters(), time.monotonic() - start
    finally:
        codes = {k: p.stop() for k, p in pipes.items()}
    scale = length / took  # ticks per `length` seconds exactly
    bpf = {}
    for name, (runs, ns) in p1.items():
        runs, ns = runs - p0.get(name, (0, 0))[0], ns - p0.get(name, (0, 0))[1]
        bpf[name] = {"runs_per_s": round(runs / took), "ns_per_run": round(ns / runs) if runs
                     else None}
    return {"arm": arm, "ticks": {k: round((t1[k] - t0[k]) * scale, 1) for k in t0},
            "serve_ticks": round((s1 - s0) * scale, 1), "bpf": bpf,
            "counters_per_s": {k: round((v - c0.get(k, 0)) / took, 1) for k, v in c1.items()
                               if v != c0.get(k, 0)},
            "private_libs_mapped": private if arm in ("untraced", "leaks") else None,
            "exit": codes, "load": os.getloadavg()[0], "tracers_on_host": _tracers()}


def _tracers() -> int:
    """BPF programs named on_probe on the host: every refcntd tracer (another's too: its
    uprobes on the same libraries fire in these pipelines as well)."""
    shown = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True,
                                      text=True, check=True).stdout)
    return sum(1 for p in shown if p.get("name") == "on_probe")


def summary(rows: list[dict], length: float) -> list[dict]:
    """Per arm: median (min-max) ticks of each pipeline and of serve; probe runs/s above
    the untraced windows' (the background: other traced processes)."""
    base = statistics.median(_uprobe(r)[0] for r in rows if r["arm"] == "untraced")
    out = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        cell = {k: _med([r["ticks"][k] for r in mine]) for k in PIPELINES}
        ns = [_uprobe(r)[1] for r in mine if _uprobe(r)[1]]
        out.append({"arm": arm, "windows": len(mine), "ticks": cell,
                    "serve_ticks": _med([r["serve_ticks"] for r in mine]),
                    "uprobe_runs_per_s_above_untraced": round(statistics.median(
                        _uprobe(r)[0] for r in mine) - base),
                    "uprobe_bpf_ns_per_run": round(statistics.median(ns)) if ns else None,
                    "load": _med([r["load"] for r in mine]), "window_s": length})
    return out


def _uprobe(row: dict) -> tuple[int, int | None]:
    """(runs/s, ns per run) of on_probe, the program every uprobe runs."""
    on = row["bpf"].get("on_probe", {"runs_per_s": 0, "ns_per_run": None})
    return on["runs_per_s"], on["ns_per_run"]


def _med(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": min(values),
            "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--window", type=float, default=30)
    parser.add_argument("--warm", type=float, default=5, help="seconds before a window")
    parser.add_argument("--serve-config", type=Path)
    parser.add_argument("--calls-for", type=float, default=10,
                        help="seconds of perf stat per pipeline (calls per function)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--stem", default="gst-cost")
    args = parser.parse_args()
    was = STATS.read_text().strip()
    commit = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="gstcost-") as tmp:
        work = Path(tmp)
        serve = Serve(work, args.serve_config)
        arms, rows = arm_setup(work, serve.program), []
        per_function = calls(arms["probed"][0], args.calls_for, args.warm)
        print(json.dumps(per_function), flush=True)
        STATS.write_text("1")
        try:
            for n in range(args.rounds):
                order = ARMS[n % len(ARMS):] + ARMS[:n % len(ARMS)]  # each arm in each place
                for arm in order:
                    rows.append({"round": n + 1} | window(serve, arm, arms[arm], args.warm,
                                                          args.window))
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            STATS.write_text(was)
            serve.stop()
    result = {"machine": machine(), "commit": commit, "started_utc": started,
              "ended_utc": time.strftime("%H:%M:%S", time.gmtime()),
              "args": {k: str(v) for k, v in vars(args).items()},
              "started_serve": args.serve_config is None, "calls_per_s": per_function,
              "rows": rows,
              "summary": summary(rows, args.window)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.stem}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def cost_table(result: dict) -> list[str]:
    """The results page's table: per arm, each pipeline's ticks and serve's, median
    (min-max) over the windows, with the uprobe figures and the load."""
    calls = result.get("calls_per_s", {})
    hits = {k: round(sum(v.values())) for k, v in calls.items()}
    window = result["summary"][0]["window_s"] if result["summary"] else 30
    lines = [f"| arm | audio ticks / {window:.0f} s | video ticks / {window:.0f} s | serve ticks "
             f"/ {window:.0f} s | on_probe runs/s, whole host | BPF ns per on_probe run "
             "| refcntd tracers on the host | load | windows |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in result["summary"]:
        t, mine = s["ticks"], [r for r in result["rows"] if r["arm"] == s["arm"]]
        runs = statistics.median(_uprobe(r)[0] for r in mine)
        tracers = sorted({r.get("tracers_on_host") for r in mine} - {None})
        lines.append(
            f"| {s['arm']} | {_cell(t['audio'])} | {_cell(t['video'])} | "
            f"{_cell(s['serve_ticks'])} | {runs:.0f} | {s['uprobe_bpf_ns_per_run']} | "
            f"{'-'.join(map(str, tracers[::max(1, len(tracers) - 1)])) or 'not counted'} | "
            f"{_cell(s['load'])} | {s['windows']} |")
    lines += ["", "Calls per second of each probed function (perf's uprobes on the one "
              f"process, --calls-for s): audio {hits.get('audio')}, video {hits.get('video')}:",
              "", "| function | audio | video |", "|---|---|---|"]
    for fn in sorted({f for v in calls.values() for f in v}):
        if any(v.get(fn) for v in calls.values()):
            lines.append(f"| {fn} | {calls.get('audio', {}).get(fn)} | "
                         f"{calls.get('video', {}).get(fn)} |")
    return lines


def _cell(c: dict[str, float]) -> str:
    return f"{c['median']:.1f} ({c['min']:.1f}-{c['max']:.1f})"
