"""Score each mutant's culprit found against the unmutated build's run (--baseline).

A developer who has a run of the same workload on the code before the change
passes it as `refcntd run/report --baseline OLD.json`; refcntd then compares
every type's operations per path (analysis.regression).  This judges that on
the benchmark: every scored mutant's newest kept run (OUT/runs/ID/repeat0.json
from `repeat`, or r0.json of a mutant `run` added since) against its
workload's baseline run (OUT/runs/CB/baseline/LABEL/r0.json: the same code,
unmutated build), through `refcntd report`'s own code path, beside the same
run's verdict without the baseline.  Writes OUT/against.json and
OUT/against.md (the tables of mutants.md) and prints the tallies.

OUT/tuned.json, when present, lists the mutants the comparison's rules were
chosen on: the others are held out, and are also tallied apart.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

import report
import runner
import score

from refcntd.analysis.baseline import against
from refcntd.analysis.model import RunResult
from refcntd.outputs.runjson import load_run

RUNS = ("repeat0.json", "r0.json")  # the newest of them is judged (see _run_json)
BASELINE = "baseline"  # how the verdicts name the baseline runs


def _run_json(directory: Path) -> Path | None:
    """The mutant's newest kept run: `repeat`'s re-run of a scored mutant, or the
    first run of a mutant `run` added since (both by code that counts operations)."""
    found = [directory / name for name in RUNS if (directory / name).exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


@functools.cache  # every mutant of a workload is judged against the same good runs
def good_run(path: Path) -> RunResult:
    """A good run, read once (against() reads the old runs, never changes them)."""
    return load_run(str(path))


def _groups(result: RunResult) -> list[score.Group]:
    return [score.from_model(g) for p in result.processes for g in p.groups]


def judge(m: dict[str, Any], out: Path, baselines: int = 1) -> dict[str, Any]:
    """One mutant's outcomes, alone and against `baselines` good runs of its workload
    (runner.verdicts' fields)."""
    scratch = out / "scratch" / m["codebase"]
    run_json = _run_json(runner.runs_dir(scratch, m["id"]))
    base_dir = runner.runs_dir(scratch, m["codebase"], "baseline", m["workload"])
    base_jsons = [base_dir / f"r{r}.json" for r in range(baselines)
                  if (base_dir / f"r{r}.json").exists()]
    if run_json is None:
        return {"outcome": "missed", "alone": "missed", "timed_out": True,
                "said": "no run kept (timed out)", "indirect": [], "deterministic": True}
    new, olds = load_run(str(run_json)), [good_run(p) for p in base_jsons]
    base = _groups(olds[0])
    alone = score.answer(score.new_groups(base, _groups(new)), m["type"])
    notes = against(new, olds, BASELINE)
    found = _groups(new)
    row = runner.verdicts([score.new_groups(base, found)], m, m["new_leaks"],
                          score.new_counts(base, found))
    decided = any(c.baseline for p in new.processes for g in p.groups
                  if g.type_name == m["type"] for c in g.culprits)
    return {**row, "alone": score.outcome(alone, m["function"]), "alone_said": score.said(alone),
            "decided": decided, "against_notes": notes}


def main(out: Path, baselines: int = 1) -> int:
    """`baselines`: good runs per workload (r0.json, r1.json, ...: `rebase --repeats`)."""
    started = time.monotonic()
    doc = json.loads((out / "mutants.json").read_text())
    rows = []
    for m in doc["mutants"]:
        row = dict(m)
        if m["status"] == "scored":
            row.update(judge(m, out, baselines))
        rows.append(row)
    doc["mutants"] = rows
    doc["against"] = {"commit": report.machine()["refcntd_commit"], "runs": RUNS,
                      "baselines": baselines,
                      "seconds": round(time.monotonic() - started, 1)}
    tuned_file = out / "tuned.json"
    tuned = set(json.loads(tuned_file.read_text())) if tuned_file.exists() else None
    (out / "against.json").write_text(json.dumps(doc, indent=1))
    (out / "against.md").write_text("\n".join(summary(rows, tuned, doc["against"])) + "\n\n"
                                    + report.markdown(doc))
    print("\n".join(summary(rows, tuned, doc["against"])))
    return 0


def summary(rows: list[dict[str, Any]], tuned: set[str] | None,
            meta: dict[str, Any]) -> list[str]:
    """The direct-leak outcomes against the baseline beside the same runs alone,
    per codebase, and for the mutants the rules were tuned on and those held out."""
    scored = [r for r in rows if r["status"] == "scored"]
    slices = [(cb, [r for r in scored if r["codebase"] == cb])
              for cb in sorted({r["codebase"] for r in scored})] + [("all", scored)]
    if tuned is not None:
        slices += [("tuned on", [r for r in scored if r["id"] in tuned]),
                   ("held out", [r for r in scored if r["id"] not in tuned])]
    lines = ["# Culprits against the unmutated build's run (`--baseline`)", "",
             f"Judged by refcntd {meta['commit']} in {meta['seconds']} s against "
             f"{meta['baselines']} good run(s) of each workload. Direct leak, "
             "each mutant's newest kept run; *alone*: the same run's own verdict.", "",
             "| mutants | scored | how | " + " | ".join(score.OUTCOMES) + " | right % | wrong % |",
             "|---|---|---" + "|---" * (len(score.OUTCOMES) + 2) + "|"]
    for name, mine in slices:
        for key, how in (("alone", "alone"), ("outcome", "against the baseline")):
            c = {k: sum(r[key] == k for r in mine) for k in score.OUTCOMES}
            lines.append(f"| {name} | {len(mine)} | {how} | "
                         + " | ".join(str(c[k]) for k in score.OUTCOMES)
                         + f" | {report.rate(c['right'], len(mine))} | "
                         f"{report.rate(c['wrong'], len(mine))} |")
    return lines
