"""Run scored mutants again: do repeated refcntd runs give the same verdict?

`rescore` shows the same events give the same verdict.  Two runs of one mutant
see different events (timing, addresses, the order the kernel's maps are
walked), so this rebuilds each chosen mutant and runs refcntd on it `repeats`
times with the current code; their verdicts (score.signature: every new group's
type, path, objects, status and culprits) must agree.  Chosen in the benchmark's
seeded order, alternating codebases.  Writes OUT/repeats.json and OUT/repeats.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import codebases
import report
import runner
import score


def main(out: Path, names: list[str], per_codebase: int, repeats: int) -> int:
    doc = json.loads((out / "mutants.json").read_text())
    rescored = out / "rescored.json"
    kept = ({m["id"]: m.get("outcome") for m in json.loads(rescored.read_text())["mutants"]}
            if rescored.exists() else {})
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    for name in names:
        cb = codebases.load(name, out)
        for rel in codebases.restore_all(cb):
            print(f"{name}: {rel} restored", flush=True)
        cb.build()
        scratch = out / "scratch" / name
        base = runner.baseline(cb, 1, scratch)
        by_id = {runner.mutant_id(cb, e): e for e in runner.executed_sites(cb)}
        scored = [m for m in doc["mutants"] if m["codebase"] == name
                  and m["status"] == "scored" and not m.get("timed_out") and m["id"] in by_id]
        for m in scored[:per_codebase]:
            r = _again(cb, by_id[m["id"]], m, base, repeats, scratch)
            r["kept_run_rescored"] = kept.get(m["id"])
            rows.append(r)
            print(f"{m['id']}: {r['outcomes']} same verdict: {r['same']}", flush=True)
        cb.build()
    result = {"machine": report.machine(), "repeats": repeats, "rows": rows,
              "seconds": round(time.monotonic() - started)}
    (out / "repeats.json").write_text(json.dumps(result, indent=1))
    (out / "repeats.md").write_text(markdown(result))
    print(markdown(result), end="")
    return 0


def _again(cb: codebases.Codebase, ex: runner.Executed, m: dict[str, Any],
           base: runner.Baseline, repeats: int, scratch: Path) -> dict[str, Any]:
    runner.apply(cb, ex.site)
    try:
        cb.build()
        w = next(x for x in cb.workloads if x.label == m["workload"])
        runs = []
        for r in range(repeats):
            json_out = runner.runs_dir(scratch, m["id"]) / f"repeat{r}.json"
            try:
                runs.append(score.new_groups(base.groups[w.label],
                                             runner.refcntd_run(cb, w, json_out)))
            except runner.TimedOut:
                return {"id": m["id"], "outcomes": ["timed out"], "same": None}
    finally:
        runner.restore(cb, ex.site)
    sigs = [score.signature(r) for r in runs]
    answers = [score.answer(r, m["type"]) for r in runs]
    return {"id": m["id"], "outcomes": [score.outcome(a, m["function"]) for a in answers],
            "same": all(s == sigs[0] for s in sigs), "said": list(map(score.said, answers)),
            "line": line_of(m, answers[0], runner.runs_dir(scratch, m["id"]) / "repeat0.json")}


def line_of(m: dict[str, Any], answer: score.Group | None, run_json: Path) -> str:
    """For an added get: is the line refcntd names that of the added call?  The
    answering group's top culprit, read from the run's --json (lines are not in
    score.Group)."""
    if m["pattern"] != "get added":
        return ""
    if answer is None:
        return "no line"
    data = json.loads(run_json.read_text())
    for proc in data["processes"]:
        for g in proc["groups"]:
            if score._group(g) == answer and g.get("culprits"):
                return score.line_outcome(g["culprits"][0], m["file"], m["line"])
    return "no line"


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    judged = [r for r in rows if r["same"] is not None]
    lines = ["# Repeated refcntd runs of the same mutants", "",
             f"Machine: {result['machine']}", "",
             f"{len(rows)} mutants rebuilt and run {result['repeats']} times each with the "
             f"current code ({result['seconds']} s); {sum(r['same'] for r in judged)} of "
             f"{len(judged)} gave the same verdict every time"
             f"{'' if len(judged) == len(rows) else f' ({len(rows) - len(judged)} timed out)'}.",
             ""]
    kept = [r for r in rows if r.get("kept_run_rescored") and r["same"] is not None]
    if kept:
        agree = sum(r["outcomes"][0] == r["kept_run_rescored"] for r in kept)
        lines += [f"Against the benchmark's kept run of the same mutant, judged by `rescore`: "
                  f"the same outcome in {agree} of {len(kept)}.", ""]
    added = [r for r in rows if r.get("line")]
    if added:
        lines += [f"Line level (added gets, first run): the named line is the added call's "
                  f"in {sum(r['line'] == 'right' for r in added)} of {len(added)}; another "
                  f"line in {sum(r['line'] == 'wrong' for r in added)}; no line named in "
                  f"{sum(r['line'] == 'no line' for r in added)}.", ""]
    lines += ["| mutant | outcomes | same verdict | line | said |", "|---|---|---|---|---|"]
    lines += [f"| {r['id']} | {', '.join(r['outcomes'])} | {r['same']} | {r.get('line', '')} | "
              f"{' / '.join(r.get('said', [])).replace('|', '/')} |" for r in rows]
    return "\n".join(lines) + "\n"
