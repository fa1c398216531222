"""The culprit regression set's smoke part (issue 55): a few kept mutant runs, copied
into tests/data/culprits/ (xz), that tests/unit/test_culprit_answers.py judges again
on every CI run.  The whole sets stay under each --out, checked by `loco.py --check`.

Usage: smokeset.py --answers LOCO.json --set OUT ... --pick ID ... [--dest DIR]
Each picked mutant's run, evidence and its workload's good runs are copied, with its
answers as loco.py judged them (the regression test fails when an answer that was right
is not).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

import runner

DEST = Path(__file__).resolve().parents[2] / "tests" / "data" / "culprits"


def _xz(src: Path, dst: Path) -> None:
    dst.write_bytes(lzma.compress(src.read_bytes(), preset=9 | lzma.PRESET_EXTREME))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--answers", type=Path, required=True)
    ap.add_argument("--set", action="append", type=Path, required=True)
    ap.add_argument("--pick", action="append", required=True)
    ap.add_argument("--baselines", type=int, default=2)
    ap.add_argument("--dest", type=Path, default=DEST)
    args = ap.parse_args(argv)
    answers = {r["id"]: r for r in json.loads(args.answers.read_text())["mutants"]}
    mutants = {m["id"]: (out, m) for out in args.set
               for m in json.loads((out / "mutants.json").read_text())["mutants"]}
    for mid in args.pick:
        out, m = mutants[mid]
        scratch = out / "scratch" / m["codebase"]
        run = runner.runs_dir(scratch, m["id"]) / "r0.json"
        base = runner.runs_dir(scratch, m["codebase"], "baseline", m["workload"])
        case = args.dest / mid.replace("/", "_").replace(":", "_")
        case.mkdir(parents=True, exist_ok=True)
        _xz(run, case / "run.json.xz")
        if runner.evidence_of(run).exists():
            _xz(runner.evidence_of(run), case / "run.evidence.jsonl.xz")
        for r in range(args.baselines):
            _xz(base / f"r{r}.json", case / f"good{r}.json.xz")
        a = answers[mid]
        (case / "case.json").write_text(json.dumps(
            {"id": mid, "codebase": m["codebase"], "type": m["type"],
             "function": m["function"],
             "answers": {mode: a[mode]["outcome"] for mode in ("alone", "against")}},
            indent=1) + "\n")
        print(case, sum(f.stat().st_size for f in case.iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
