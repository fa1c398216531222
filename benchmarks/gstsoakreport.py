"""The gst soak's verdicts and results page (benchmarks/gstsoak.py): issue 58's goals
judged on the minutes after the warm-up, the pipeline runs against GStreamer's leaks
tracer, and the minute-by-minute table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gstcost import cost_table
from run import machine
from soakreport import RSS_GOAL, SCRAPE_GOAL_MS, after_warmup, machine_line, save, slope


def _spread(rows: list[dict], key: str) -> tuple[float, float]:
    values = [r["process"][key] for r in rows]
    return min(values), max(values)


def _scans_ok(r: dict) -> bool:
    leaks = r.get("leaks")
    return bool(leaks) and leaks["scanned"] == ["audio", "video"] and not leaks["skipped"] \
        and leaks["lost"] == 0


def judge(rows: list[dict], end: dict, warmup: int) -> list[dict]:
    after = after_warmup(rows, warmup)
    base, top = after[0]["process"]["rss_mib"], max(r["process"]["rss_mib"] for r in after)
    runs = end["runs"]
    wrong = [f"{r['kind']} {r.get('run')}: {r['why']}" for r in runs if not r["exact"]]
    fds, threads = _spread(after, "fds"), _spread(after, "threads")
    scrapes = [r["scrape_max_ms"] for r in rows[1:]]
    last = rows[-1]["metrics"]
    bad_scans = [r["minute"] for r in rows if not _scans_ok(r)]
    return [
        {"goal": f"RSS after the warm-up ({warmup} min) within {RSS_GOAL:.0%} of its first "
                 "value", "met": top <= base * (1 + RSS_GOAL),
         "figure": f"{base} -> max {top} MiB ({(top / base - 1) * 100:+.1f} %)"},
        {"goal": "every pipeline run reported once, exit 0, tracing complete, as many "
                 "objects alive at exit (made after gst_init()) as the leaks tracer listed "
                 "at gst_deinit() (having listed the live ones at a SIGUSR1 just before)",
         "met": bool(runs) and not wrong,
         "figure": f"{len(runs) - len(wrong)} of {len(runs)} exact" +
                   (f"; {'; '.join(wrong[:5])}" if wrong else "")},
        {"goal": "each minute's GET /leaks scanned both pipelines once, skipped none, "
                 "found nothing lost", "met": not bad_scans,
         "figure": f"{len(rows) - len(bad_scans)} of {len(rows)} minutes" +
                   (f"; not at minutes {bad_scans[:10]}" if bad_scans else "")},
        {"goal": "fds and threads flat after the warm-up", "met": fds[0] == fds[1] and
         threads[0] == threads[1], "figure": f"fds {fds[0]:.0f}-{fds[1]:.0f}, threads "
                                             f"{threads[0]:.0f}-{threads[1]:.0f}"},
        {"goal": "nothing dropped (kernel records, report files)",
         "met": not last.get("dropped_records") and not last.get("report_errors"),
         "figure": f"dropped {last.get('dropped_records', 0):.0f}, report errors "
                   f"{last.get('report_errors', 0):.0f}"},
        {"goal": f"every scrape under {SCRAPE_GOAL_MS:.0f} ms (after the first minute)",
         "met": all(s is not None and s < SCRAPE_GOAL_MS for s in scrapes) and all(
             r["up_min"] == 1 for r in rows[1:]),
         "figure": f"slowest {max((s or 0) for s in scrapes) if scrapes else 0} ms of "
                   f"{sum(r.get('scrapes') or 0 for r in rows[1:]):.0f} scrapes"},
        {"goal": "serve exits 0 at SIGTERM", "met": end["serve_exit"] == 0,
         "figure": str(end["serve_exit"])},
        {"goal": "every request of the soak answered (/leaks, /metrics, the checks)",
         "met": not end["errors"], "figure": "; ".join(end["errors"][:5]) or "all"},
    ]


def _shown(rows: list[dict], end: dict) -> list[str]:
    """Figures shown, not judged."""
    gaps = {k: max((r["gaps_ms"].get(k) or 0) for r in rows[1:] or rows) for k in
            ("audio", "video")}
    stops = [r["leaks"]["stop_ms"] for r in rows if r.get("leaks") and r["leaks"]["stop_ms"]]
    older = max((v for r in rows for k, v in r["metrics"].items()
                 if k.startswith("live_objects_older")), default=0)
    return [f"largest gap between two buffers after the first minute: audio {gaps['audio']} ms, "
            f"video {gaps['video']} ms; the longest /leaks stop {max(stops, default=0)} ms; "
            f"anomalies {rows[-1]['metrics'].get('anomalies', 0):.0f}; live objects older "
            f"than the threshold at most {older:.0f}; reports of other users' gst-launch-1.0 "
            f"processes {end['others']}."]


def _rows_table(rows: list[dict]) -> list[str]:
    head = ("| min | RSS MiB | fds | thr | CPU s | objs | live GObject | live mini | "
            "scrape max ms | /leaks ms | stop ms | lost | gap audio ms | gap video ms | "
            "load | events |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p, m, lk = r["process"], r["metrics"], r.get("leaks") or {}
        lines.append(
            f"| {r['minute']} | {p['rss_mib']} | {p['fds']} | {p['threads']} | {p['cpu_s']} "
            f"| {r['bpf']['entries'].get('objs', 0)} | {m.get('live_objects GObject', 0):.0f} "
            f"| {m.get('live_objects GstMiniObject', 0):.0f} | {r['scrape_max_ms']} "
            f"| {lk.get('ms')} | {lk.get('stop_ms')} | {lk.get('lost')} "
            f"| {r['gaps_ms'].get('audio')} | {r['gaps_ms'].get('video')} | {r['load']:.1f} "
            f"| {'; '.join(r['events'])} |")
    return lines


def _runs_table(runs: list[dict]) -> list[str]:
    lines = ["| pipeline | run | pid | minutes | exit | buffers | tracer: live at SIGUSR1 | "
             "tracer: alive at exit | refcntd: alive at exit | refcntd: alive at exit, made "
             "in gst_init() | kept by library | exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        kept = sum(r.get("kept_by_library", {}).values())
        lines.append(
            f"| {r['kind']} | {r.get('run')} | {r.get('pid')} | {r.get('minutes')} "
            f"| {r.get('exit')} | {r.get('buffers')} | {r.get('tracer_live_at_usr1')} "
            f"| {json.dumps(r.get('tracer_at_exit'))} | {json.dumps(r.get('refcntd_at_exit'))} "
            f"| {json.dumps(r.get('refcntd_in_gst_init'))} | {kept} "
            f"| {'yes' if r['exact'] else '**no**: ' + r['why']} |")
    return lines


def write(out: Path, stem: str, args: argparse.Namespace, rows: list[dict], end: dict,
          verdict: list[dict]) -> None:
    after = after_warmup(rows, args.warmup)
    m = end.get("machine") or machine()  # as it ran (a page made again from raw.json)
    text = [f"# `refcntd serve` on real GStreamer pipelines for {args.minutes} minutes "
            f"({stem})", "",
            machine_line(m, rows) +
            f" Command: `benchmarks/gstsoak.py --minutes {args.minutes} --warmup "
            f"{args.warmup} --restart-every {args.restart_every} --program {args.program}` "
            f"at {end.get('commit', '?')}.",
            "", f"RSS slope after the warm-up {slope(after):+.2f} MiB/min.", "",
            "| goal | met | figure |", "|---|---|---|"]
    text += [f"| {v['goal']} | {'yes' if v['met'] else '**no**'} | {v['figure']} |"
             for v in verdict]
    text += ["", *_shown(rows, end), "", "Each pipeline run, checked when it was restarted "
             "or at the end:", "", *_runs_table(end["runs"]), ""]
    for path in args.cost or []:
        cost = json.loads(path.read_text())
        text += [f"CPU cost (benchmarks/gstcost.py, {path.name}, {cost['args'].get('rounds')} "
                 "rounds of the four arms, alternated):", "", *cost_table(cost), ""]
    text += [
             "Each minute (the /leaks scan first, then serve's figures; a restart after "
             "them):", "", *_rows_table(rows)]
    save(out, stem, text, {"machine": m, "args": {k: str(v) for k, v in vars(args).items()},
                           "rows": rows, "end": end, "verdict": verdict})
