"""Judge the kept runs of a benchmark run again with the current inference.

`mutants.py run` keeps every refcntd run's inference inputs under OUT/runs/
(REFCNTD_DUMP_EVIDENCE).  This re-runs verdicts.judge_process on them, scores
the answers as the run did (score.py, runner.verdicts) and writes
OUT/rescored.json and OUT/rescored.md: seconds, no build, no trace.  Each
input is judged twice, in two interpreters with different hash seeds: a
verdict that changes is reported as nondeterministic (the same events must
give the same verdict).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import report
import runner
import score

from refcntd.analysis import evidencedump
from refcntd.analysis.verdicts import judge_process

HASH_SEEDS = ("1", "2")
# MUTANTS_STRIP_INLINED=1: the kept runs judged without the frames of inlined functions
# (issue 41 added them), the inference's inputs as they were before; written to
# rescored-stripped.json / .md
STRIP = os.environ.get("MUTANTS_STRIP_INLINED") == "1"
INLINED = "inlined"


def _stripped(kept: list[Any]) -> list[Any]:
    """One process's inference inputs without inlined frames."""
    from refcntd.analysis.pathops import PathOp
    from refcntd.analysis.verdicts import Evidence

    def op(o: PathOp) -> PathOp:
        return PathOp(o.op, tuple(f for f in o.frames if f.raw != INLINED), o.count,
                      o.first_ns, o.last_ns)
    out = []
    for groups, paths, released in kept:
        for g in groups:
            g.frames = tuple(f for f in g.frames if f.raw != INLINED)
        paths = {k: [Evidence(e.address, e.type_name, e.init_ns, [op(o) for o in e.ops], e.gap)
                     for e in v] for k, v in paths.items()}
        released = {k: [op(o) for o in v] for k, v in released.items()}
        out.append((groups, paths, released))
    return out


def judged(evidence: Path) -> list[score.Group]:
    """The groups of one kept run, judged by the current inference (a run whose
    evidence file is missing had no leaked object, so nothing to dump)."""
    out = []
    if not evidence.exists():
        return out
    kept = evidencedump.load(evidence)
    for groups, paths, released in _stripped(kept) if STRIP else kept:
        if paths:
            judge_process(groups, paths, released)
        out += [score.from_model(g) for g in groups]
    return out


def inputs(out: Path, doc: dict[str, Any]) -> dict[str, Path]:
    """Every kept run the document refers to: baselines and scored mutants."""
    found: dict[str, Path] = {}
    repeats = doc["repeats"]
    for cb, cdoc in doc["codebases"].items():
        scratch = out / "scratch" / cb
        for label in cdoc["workloads"]:
            for r in range(repeats):
                found[f"{cb}/baseline/{label}/{r}"] = runner.evidence_of(
                    runner.runs_dir(scratch, cb, "baseline", label) / f"r{r}.json")
    for m in doc["mutants"]:
        if m["status"] != "scored" or m.get("timed_out"):
            continue
        scratch = out / "scratch" / m["codebase"]
        for r in range(repeats):
            found[f"{m['id']}/{r}"] = runner.evidence_of(runner.runs_dir(scratch, m["id"]) /
                                                          f"r{r}.json")
    return found


JUDGE_LIMIT_S = 60


class _Slow(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Slow()


def judge_all(out: Path) -> dict[str, list[list[Any]] | None]:
    """Kept run -> its judged groups, as plain lists (compared across hash seeds);
    None for a run the inference could not judge within JUDGE_LIMIT_S."""
    doc = json.loads((out / "mutants.json").read_text())
    signal.signal(signal.SIGALRM, _alarm)
    found: dict[str, list[list[Any]] | None] = {}
    for key, path in inputs(out, doc).items():
        if not (path.exists() or path.with_name(path.name.split(".")[0] + ".json").exists()):
            continue
        signal.alarm(JUDGE_LIMIT_S)
        try:
            found[key] = [list(map(_plain, g.__dict__.values())) for g in judged(path)]
        except _Slow:
            found[key] = None
        finally:
            signal.alarm(0)
    return found


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _child(out: Path, seed: str) -> dict[str, list[list[Any]] | None]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, check=True,
                          capture_output=True, text=True)
    result: dict[str, list[list[Any]] | None] = json.loads(proc.stdout)
    return result


def main(out: Path) -> int:
    started = time.monotonic()
    doc = json.loads((out / "mutants.json").read_text())
    with concurrent.futures.ThreadPoolExecutor(len(HASH_SEEDS)) as pool:
        first, second = pool.map(lambda seed: _child(out, seed), HASH_SEEDS)
    slow = {k for k, v in first.items() if v is None}
    groups = {k: [score.Group(*(tuple(x) if isinstance(x, list) else x for x in g))
                  for g in v] for k, v in first.items() if v is not None}
    base: dict[str, dict[str, list[score.Group]]] = {}
    for cb, cdoc in doc["codebases"].items():
        base[cb] = {label: groups.get(f"{cb}/baseline/{label}/0", [])
                    for label in cdoc["workloads"]}
        cdoc["baseline_rescored"] = {label: len(g) for label, g in base[cb].items()}
    rows, missing = [], 0
    for m in doc["mutants"]:
        row = dict(m)
        if m["status"] == "scored" and not m.get("timed_out"):
            keys = [f"{m['id']}/{r}" for r in range(doc["repeats"])]
            if any(k in slow for k in keys):
                row.update({"outcome": "missed", "judge_slow": True,
                            "said": f"judging took over {JUDGE_LIMIT_S} s"})
            elif not all(k in groups for k in keys):
                missing += 1
                row["status"] = "not kept"
            else:
                before = base[m["codebase"]][m["workload"]]
                runs = [score.new_groups(before, groups[k]) for k in keys]
                row.update(runner.verdicts(runs, m, m["new_leaks"],
                                           score.new_counts(before, groups[keys[0]])))
                row["hash_stable"] = all(first[k] == second.get(k) for k in keys)
                row["deterministic"] = row["deterministic"] and row["hash_stable"]
        rows.append(row)
    doc["mutants"] = rows
    doc["rescored"] = {"commit": report.machine()["refcntd_commit"],
                       "seconds": round(time.monotonic() - started, 1),
                       "runs_not_kept": missing}
    name = "rescored-stripped" if STRIP else "rescored"
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{name}.md").write_text(report.markdown(doc))
    scored = [r for r in rows if r["status"] == "scored"]
    tally = {k: sum(r["outcome"] == k for r in scored) for k in score.OUTCOMES}
    print(f"rescored {len(scored)} mutants in {doc['rescored']['seconds']} s: {tally}; "
          f"hash-unstable {sum(not r.get('hash_stable', True) for r in scored)}; "
          f"too slow to judge {sum(bool(r.get('judge_slow')) for r in scored)}; "
          f"not kept {missing}")
    return 0


if __name__ == "__main__":
    print(json.dumps(judge_all(Path(sys.argv[1]))))
