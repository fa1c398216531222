"""mutants.md from mutants.json: the machine, the counts, the scores per pattern."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

from score import OUTCOMES

REPO = Path(__file__).resolve().parent.parent.parent
PATTERNS = ("put deleted", "get added")


def machine() -> dict[str, Any]:
    mem = Path("/proc/meminfo").read_text().split()[1]
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": round(int(mem) / 2**20, 1), "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "refcntd_commit": commit,
            "load_at_start": Path("/proc/loadavg").read_text().split()[:3]}


def rate(num: int, den: int) -> str:
    return f"{100 * num / den:.0f} %" if den else "-"


def score_row(label: str, outcomes: list[str]) -> str:
    n = len(outcomes)
    c = {k: outcomes.count(k) for k in OUTCOMES}
    precision = rate(c["right"], c["right"] + c["wrong"])
    return (f"| {label} | {n} | " + " | ".join(str(c[k]) for k in OUTCOMES)
            + f" | {precision} | {rate(c['right'], n)} |")


def score_table(mutants: list[dict[str, Any]]) -> list[str]:
    head = ["| pattern | scored | " + " | ".join(OUTCOMES) + " | precision | recall |",
            "|---|---" + "|---" * (len(OUTCOMES) + 2) + "|"]
    scored = [m for m in mutants if m["status"] == "scored"]
    rows = []
    for cb in sorted({m["codebase"] for m in scored}) + ["all"]:
        mine = [m for m in scored if cb in ("all", m["codebase"])]
        for p in PATTERNS:
            direct = [m["outcome"] for m in mine if m["pattern"] == p]
            if direct:
                rows.append(score_row(f"{cb}: {p}, direct", direct))
            ind = [i["outcome"] for m in mine if m["pattern"] == p for i in m["indirect"]]
            if ind:
                rows.append(score_row(f"{cb}: {p}, indirect", ind))
        rows.append(score_row(f"**{cb}: all direct**", [m["outcome"] for m in mine]))
    return head + rows


def counts(doc: dict[str, Any], cb: str) -> str:
    ms = [m for m in doc["mutants"] if m["codebase"] == cb]
    cov = doc["codebases"].get(cb, {}).get("coverage", {})
    status = {s: sum(m["status"] == s for m in ms) for s in
              ("scored", "equivalent", "build failed", "truth lost events")}
    return (f"{cb}: {cov.get('sites', '?')} call sites found in the source, "
            f"{cov.get('with_code', '?')} with code in the build, "
            f"{cov.get('executed', '?')} executed by the workload; {len(ms)} mutants built and "
            f"run: {status['scored']} leak (scored), {status['equivalent']} equivalent "
            f"(no new leaked object), {status['build failed']} did not build, "
            f"{status['truth lost events']} lost trace events")


def timing(doc: dict[str, Any], cb: str) -> str:
    """Median seconds per step of one mutant."""
    ms = [m for m in doc["mutants"] if m["codebase"] == cb]
    parts = []
    for key, what in (("build_s", "incremental build"), ("truth_s", "ftrace truth run"),
                      ("refcntd_s", "refcntd runs (all repeats)")):
        vals = [m[key] for m in ms if key in m]
        if vals:
            parts.append(f"{what} {statistics.median(vals):.1f} s (max {max(vals):.0f})")
    return f"{cb}, median per mutant: " + ", ".join(parts)


def findings(mutants: list[dict[str, Any]]) -> list[str]:
    """How the direct answers that were not right went wrong, counted."""
    scored = [m for m in mutants if m["status"] == "scored"]
    kinds = {
        "refcntd run over the time limit (thousands of leaked objects)":
            [m for m in scored if m.get("timed_out")],
        "judging the kept run took over the rescore's limit (under load)":
            [m for m in scored if m.get("judge_slow")],
        "no new leak group of the mutated type":
            [m for m in scored if m["said"] == "no new group"],
        "the direct leak reported indirect or as a cycle":
            [m for m in scored if m["said"].startswith(("indirect", "cycle"))],
        "culprit unknown":
            [m for m in scored if m["said"].startswith("unknown")],
        "a caller named instead (the mutated function was inlined into it)":
            [m for m in scored if m.get("named_inliner")],
        "wrong: another function named as the culprit":
            [m for m in scored if m["outcome"] == "wrong"],
    }
    return [f"* {what}: {len(ms)} ({', '.join(sorted({m['codebase'] for m in ms}))})"
            for what, ms in kinds.items() if ms]


def mutant_rows(mutants: list[dict[str, Any]]) -> list[str]:
    out = ["| mutant | call | function | pattern | truth: new leaks | refcntd | outcome |",
           "|---|---|---|---|---|---|---|"]
    for m in mutants:
        if m["status"] != "scored":
            continue
        new = ", ".join(f"{t} +{n}" for t, n in m["new_leaks"].items())
        flag = "" if m["deterministic"] else " (repeats differ: " + \
            "/".join(m["repeat_outcomes"]) + ")"
        said = m["said"] if len(m["said"]) < 140 else m["said"][:137] + "..."
        out.append(f"| {m['codebase']} {m['file']}:{m['line']} | {m['call']} | {m['function']} "
                   f"| {m['pattern']} | {new} | {said.replace('|', '/')} | {m['outcome']}{flag} |")
    return out


def markdown(doc: dict[str, Any]) -> str:
    mutants = doc["mutants"]
    lines = ["# Culprit accuracy on real-code mutants", "",
             f"Machine: {doc['machine']}", "",
             f"Run from {doc['started']} to {doc.get('finished', '?')}, "
             f"{doc['repeats']} refcntd runs per mutant"
             f"{' (stopped early: time limit)' if doc.get('stopped_early') else ''}.", ""]
    if doc.get("rescored"):
        r = doc["rescored"]
        lines += [f"Judged again (`mutants.py rescore`) by refcntd commit {r['commit']} in "
                  f"{r['seconds']} s: every score below is that inference's, on the kept "
                  "runs; the runs themselves were made by the commit above.", ""]
    rerun = sorted({m["rerun"] for m in mutants if m.get("rerun")})
    if rerun:
        n = sum(1 for m in mutants if m.get("rerun"))
        lines += [f"{n} mutants were run again (`run --retry-timed-out`, "
                  f"`--retry-missed`) by refcntd {', '.join(rerun)}.", ""]
    recounted = {name: cb["retruth"] for name, cb in doc["codebases"].items()
                 if cb.get("retruth")}
    if recounted:
        lines += ["The truth of the baselines and scored mutants was counted again "
                  "(`mutants.py retruth`, the mutants rebuilt, not traced by refcntd): "
                  + ", ".join(f"{n} by {c}" for n, c in recounted.items()) + ".", ""]
    for name, cb in doc["codebases"].items():
        lines += [f"## {name}", "", f"* prepared: `{cb['prepared']}`",
                  f"* spec: `{cb['spec']}`", "* workloads:"]
        lines += [f"  * {label}: `{cmd}`" for label, cmd in cb["workloads"].items()]
        lines += [f"* baseline {label}: truth {b['truth']['objects'] or 'no leak'}, "
                  f"{len(b['refcntd_groups'])} refcntd leak groups, "
                  f"repeatable: {b['repeatable']}" for label, b in cb["baseline"].items()]
        lines += ["", counts(doc, name), "", timing(doc, name), ""]
    lines += ["## Scores", "", *score_table(mutants), ""]
    nondet = [m for m in mutants if m["status"] == "scored" and not m["deterministic"]]
    lines += [f"Repeats that disagreed: {len(nondet)} of "
              f"{sum(m['status'] == 'scored' for m in mutants)} scored mutants.", "",
              *same_leaks(mutants),
              "Direct answers, by what refcntd said:", "", *findings(mutants), ""]
    lines += ["## Mutants", "", *mutant_rows(mutants), ""]
    return "\n".join(lines)


def same_leaks(mutants: list[dict[str, Any]]) -> list[str]:
    """Whether refcntd's run leaked what the truth run did (two executions of the
    same build): the mutants where the new leaked objects per type differ."""
    checked = [m for m in mutants if m["status"] == "scored" and "same_leaks" in m]
    if not checked:
        return []
    differ = [m for m in checked if not m["same_leaks"]]
    lines = [f"New leaked objects per type, refcntd's run against the truth run: the same "
             f"in {len(checked) - len(differ)} of {len(checked)} scored mutants.", ""]
    if differ:
        lines += ["| mutant | truth | refcntd | outcome |", "|---|---|---|---|"]
        lines += [f"| {m['id']} | {_counts(m['new_leaks'])} | {_counts(m['refcntd_new'])} "
                  f"| {m['outcome']} |" for m in differ]
        lines.append("")
    return lines


def _counts(by_type: dict[str, int]) -> str:
    return ", ".join(f"{t} {n}" for t, n in sorted(by_type.items())) or "none"


def compare(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Before/after scores of one benchmark run judged by two inferences, and the
    mutants whose outcome changed."""
    lines = ["# Culprits on real-code mutants: before and after", "",
             f"Machine: {after['machine']}", "",
             f"The same kept runs ({after['started']} to {after['finished']}, "
             f"{after['repeats']} refcntd run(s) per mutant) judged by refcntd "
             f"{before.get('rescored', {}).get('commit', '?')} (before) and "
             f"{after.get('rescored', {}).get('commit', '?')} (after) with "
             "`benchmarks/mutants/mutants.py rescore`.", "",
             "## Before", "", *score_table(before["mutants"]), "",
             "## After", "", *score_table(after["mutants"]), "",
             "Direct answers after, by what refcntd said:", "", *findings(after["mutants"]), "",
             "## Outcomes that changed", "",
             "| mutant | function | before | after: refcntd | after |", "|---|---|---|---|---|"]
    old = {m["id"]: m for m in before["mutants"]}
    for m in after["mutants"]:
        b = old.get(m["id"])
        if m["status"] != "scored" or b is None or b.get("outcome") == m["outcome"]:
            continue
        lines.append(f"| {m['id']} | {m['function']} | {b.get('outcome')} | "
                     f"{m['said'][:120].replace('|', '/')} | {m['outcome']} |")
    return "\n".join(lines) + "\n"
