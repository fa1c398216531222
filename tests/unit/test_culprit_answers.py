"""The culprit regression set, smoke part (issue 55): kept runs of real mutants
(tests/data/culprits/, copied by benchmarks/mutants/smokeset.py) judged again by the
current inference, alone and against their good runs, as benchmarks/mutants/loco.py
does.  An answer that was right must stay right: a rule change that turns it wrong or
unknown fails here.  The whole sets: `loco.py --check`."""

from __future__ import annotations

import json
import lzma
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# CULPRIT_CASES=DIR: another set of cases (smokeset.py --dest), e.g. to try a rule change
CASES = sorted(Path(os.environ.get("CULPRIT_CASES", ROOT / "tests" / "data" / "culprits"))
               .glob("*/case.json"))
sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))


def _unxz(src: Path, dst: Path) -> Path:
    dst.write_bytes(lzma.decompress(src.read_bytes()))
    return dst


def test_the_set_spans_codebases():
    assert len({json.loads(c.read_text())["codebase"] for c in CASES}) >= 3


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.parent.name)
def test_a_right_answer_stays_right(case: Path, tmp_path: Path) -> None:
    import loco

    want = json.loads(case.read_text())
    d = case.parent
    run = _unxz(d / "run.json.xz", tmp_path / "r0.json")
    if (d / "run.evidence.jsonl.xz").exists():
        _unxz(d / "run.evidence.jsonl.xz", tmp_path / "r0.evidence.jsonl")
    goods = [_unxz(g, tmp_path / g.name.removesuffix(".xz"))
             for g in sorted(d.glob("good*.json.xz"))]
    got = loco.judge_files(run, goods, want["type"], want["function"])
    for mode, outcome in want["answers"].items():
        if outcome == "right":
            assert got[mode]["outcome"] == "right", (mode, got[mode])
