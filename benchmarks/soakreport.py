"""The soak's verdicts and results page (benchmarks/soak.py): each goal of issue 43
judged on the minutes after the warm-up, and the minute-by-minute table."""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from run import machine

SCRAPE_GOAL_MS = 100.0
RSS_GOAL = 0.10  # after the warm-up, within 10 % of its value at the warm-up's end
# LRU maps fill to their capacity by design (released objects remembered to describe
# a later misuse): bounded, their kernel memory preallocated; shown, not judged
LRU_MAPS = {"graveyard", "unknown_seen", "may_leak", "put_due", "early_ops",
            "last_released", "exec_maps", "pending_mmap"}
# the service's own live objects: one creation-time bin per checkpointed minute; the
# spec's type names (3 per tracer: a tracer new after an upgrade has none until its
# first process); counters of live host processes (their number is the host's)
WORKLOAD_MAPS = {"age_bins", "since", "types", "totals", "proc_stats"}
PROC_STATS_BOUND = 64  # live processes with counters at a pause, on this shared host
SVC_REQUESTS = 20  # the service's requests between a checkpoint and its diff


def after_warmup(rows: list[dict], warmup: int) -> list[dict]:
    return [r for r in rows if r["minute"] > warmup] or rows[-1:]


def _rss(rows: list[dict]) -> dict[str, tuple[float, float]]:
    """(first, max) RSS after the warm-up, by whether extra's tracer was attached."""
    out: dict[str, tuple[float, float]] = {}
    for r in rows:
        tag, v = ("with extra" if r.get("extra") else "3 targets"), r["process"]["rss_mib"]
        base, top = out.get(tag, (v, v))
        out[tag] = (base, max(top, v))
    return out


def _floors(rows: list[dict]) -> dict[str, list[float]]:
    """Per quantity that must return to its floor at each pause: its values, grouped by
    whether `extra` was attached (its tracer has its own fds, threads and maps)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        tag = "+extra" if r.get("extra") else ""
        for name in ("fds", "threads"):
            out.setdefault(name + tag, []).append(r["process"][name])
        out.setdefault("maps" + tag, []).append(r["bpf"]["maps"])
        for m, n in r["bpf"]["entries"].items():
            if m not in LRU_MAPS | WORKLOAD_MAPS:
                # the service's leaked conns are its own live objects, not refcntd's
                live = r["svc_live_at_sample"] if m == "objs" else 0
                out.setdefault(f"entries {m}{tag}", []).append(n - live)
    return out


def _fd_growth(settled: list[dict]) -> str:
    """Which kinds of fd (refcntd.kernel.procfds.fd_kinds) the last settled pause holds more of than
    the first one with the same tracers."""
    out = []
    for extra in (False, True):
        same = [r["process"].get("fd_kinds") for r in settled if bool(r.get("extra")) == extra]
        same = [k for k in same if k is not None]
        if len(same) > 1:
            grew = {k: n - same[0].get(k, 0) for k, n in same[-1].items()
                    if n > same[0].get(k, 0)}
            out += [f"{'+extra ' if extra else ''}{k} +{n}" for k, n in grew.items()]
    return f"; fds grown: {', '.join(out)}" if out else ""


def judge(rows: list[dict], end: dict, warmup: int) -> list[dict]:
    after = after_warmup(rows, warmup)
    rss = _rss(after)
    # a pause whose reports were still being written (the workers behind) holds their
    # processes' entries: the floor is read where every process was reported
    settled = [r for r in after if not r["missing"]] or after[-1:]
    floors = _floors(settled)
    grown = {k: (min(v), max(v)) for k, v in floors.items() if max(v) != min(v)}
    scrapes = [r["scrape_max_ms"] for r in rows[1:]]
    last = rows[-1]["metrics"]
    return [
        {"goal": f"RSS after the warm-up within {RSS_GOAL:.0%} of its first value (with and "
                 "without the extra target's tracer apart)",
         "met": all(top <= base * (1 + RSS_GOAL) for base, top in rss.values()),
         "figure": "; ".join(f"{tag}: {base} -> max {top} MiB" for tag, (base, top)
                             in rss.items())},
        {"goal": "fds, threads, maps and map entries back to their floor at each pause "
                 "where every process was reported",
         "met": not grown, "figure": (json.dumps(grown) if grown else "flat") +
         f" ({len(settled)} of {len(after)} pauses settled)" + _fd_growth(settled)},
        {"goal": f"per-process counters of untraced processes swept (proc_stats <= "
                 f"{PROC_STATS_BOUND} at each pause)",
         "met": all(r["bpf"]["entries"].get("proc_stats", 0) <= PROC_STATS_BOUND for r in after),
         "figure": f"max {max(r['bpf']['entries'].get('proc_stats', 0) for r in after)}"},
        {"goal": "nothing dropped (kernel records, report files)",
         "met": not last.get("refcntd_dropped_records") and not last.get(
             "refcntd_report_errors") and not end["incomplete"],
         "figure": f"dropped {last.get('refcntd_dropped_records', 0):.0f}, report errors "
                   f"{last.get('refcntd_report_errors', 0):.0f}, incomplete reports "
                   f"{len(end['incomplete'])}"},
        {"goal": "every exited process's report equals its truth",
         "met": not (end["wrong"] or end["missing"] or end["unexpected"] or end["failed"]),
         "figure": f"{end['exact']} exact, {len(end['wrong'])} wrong, {len(end['missing'])} "
                   f"missing, {len(end['unexpected'])} unexpected, {len(end['failed'])} "
                   "launches failed"},
        {"goal": f"each minute's diff of the service shows exactly its {SVC_REQUESTS} new leaks",
         "met": all(r["svc_diff_conns"] == SVC_REQUESTS for r in rows),
         "figure": str(sorted({r["svc_diff_conns"] for r in rows}))},
        {"goal": f"every scrape under {SCRAPE_GOAL_MS:.0f} ms (after the first minute)",
         "met": all(s is not None and s < SCRAPE_GOAL_MS for s in scrapes) and all(
             r["up_min"] == 1 for r in rows[1:]),
         "figure": f"slowest {max((s or 0) for s in scrapes) if scrapes else 0} ms; "
                   f"{sum(r.get('slow_scrapes') or 0 for r in rows[1:]):.0f} of "
                   f"{sum(r.get('scrapes') or 0 for r in rows[1:]):.0f} scrapes over "
                   f"{SCRAPE_GOAL_MS:.0f} ms"},
        {"goal": "every counter monotonic through upgrades and reloads",
         "met": not end["resets"],
         "figure": json.dumps(end["resets"]) if end["resets"] else "none went down"},
        {"goal": "serve exits 0 at SIGTERM", "met": end["serve_exit"] == 0,
         "figure": str(end["serve_exit"])},
        {"goal": "every request of the soak answered (pprof, checkpoint, diff, status)",
         "met": not end["errors"], "figure": "; ".join(end["errors"][:5]) or "all"},
    ]


def slope(rows: list[dict]) -> float:
    """MiB per minute of RSS, least squares."""
    if len(rows) < 2:
        return 0.0
    xs = [r["minute"] for r in rows]
    ys = [r["process"]["rss_mib"] for r in rows]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / \
        sum((x - mx) ** 2 for x in xs)


def _table(rows: list[dict]) -> list[str]:
    head = ("| min | RSS MiB | arenas | fds | thr | CPU s | maps | memlock MiB | objs | stacks | "
            "history | procs | dropped | scrape max ms | slow | gc>100ms | pprof ms | "
            "reports exact | load | events |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e, p = r["bpf"]["entries"], r["process"]
        lines.append(
            f"| {r['minute']} | {p['rss_mib']} | {p.get('malloc_arenas', '')} | {p['fds']} "
            f"| {p['threads']} | {p['cpu_s']} "
            f"| {r['bpf']['maps']} | {r['bpf']['memlock_kib'] / 1024:.0f} | {e.get('objs', 0)} "
            f"| {e.get('stack_store', 0)} | {e.get('history', 0)} | {e.get('procs', 0)} "
            f"| {r['metrics'].get('refcntd_dropped_records', 0):.0f} | {r['scrape_max_ms']} "
            f"| {r.get('slow_scrapes', '')} | {r.get('long_gc_pauses', '')} | {r['pprof_ms']} "
            f"| {r['exact']} | {r['load']:.1f} "
            f"| {'; '.join(r['events'])} |")
    return lines


def write(out: Path, stem: str, args: argparse.Namespace, rows: list[dict], end: dict,
          verdict: list[dict]) -> None:
    after = after_warmup(rows, args.warmup)
    m = machine()
    text = [f"# Soak: `refcntd serve` for {args.minutes} minutes ({stem})", "",
            machine_line(m, rows) + " Command: `benchmarks/soak.py "
            f"--minutes {args.minutes} --warmup {args.warmup} --rate {args.rate:.0f} "
            f"--upgrade-every {args.upgrade_every} --reload-every {args.reload_every}`.", "",
            f"{end['launched']} processes launched ({end['exact']} reports checked exact; "
            f"{end['launched'] / max(1.0, rows[-1]['t_s'] / 60):.0f} a minute achieved of "
            f"{args.rate:.0f} asked), "
            f"RSS slope after the warm-up {slope(after):+.2f} MiB/min.", "",
            "| goal | met | figure |", "|---|---|---|"]
    text += [f"| {v['goal']} | {'yes' if v['met'] else '**no**'} | {v['figure']} |"
             for v in verdict]
    text += ["", "Each minute, taken while the churn pauses (its processes gone and "
             "reported): entries are summed over the tracers (one per attached binary).", ""]
    text += _table(rows)
    save(out, stem, text, {"machine": m, "args": {k: str(v) for k, v in vars(args).items()},
                           "rows": rows, "end": end, "verdict": verdict})


def machine_line(m: dict, rows: list[dict]) -> str:
    """Where and under what load a soak ran, for the top of its page."""
    return (f"{m['date']}, {m['cpus']} vCPU {m['cpu']}, Linux {m['kernel']}, "
            f"{m['memory_gib']} GiB; load average {min(r['load'] for r in rows):.1f}-"
            f"{max(r['load'] for r in rows):.1f} over the run (other engineers' work shares "
            "the two cores).")


def save(out: Path, stem: str, text: list[str], payload: dict) -> None:
    """The page (stem.md, also printed) and its figures (stem.json)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text("\n".join(text) + "\n")
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    print("\n".join(text))


def publish(args: argparse.Namespace, rows: list[dict], end: dict,
            judge: Callable[[list[dict], dict, int], list[dict]],
            write: Callable[..., None]) -> int:
    """Judge a soak's rows, write its page; 0 when every goal is met."""
    verdict = judge(rows, end, args.warmup)
    write(args.out, args.stem, args, rows, end, verdict)
    return 0 if all(v["met"] for v in verdict) else 1
