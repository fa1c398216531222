"""Which culprit rules may name a function: measured on real mutants, not assumed.

Every culprit carries the rule that named it (Culprit.rule).  Rules written on one
codebase did not transfer to others (issue 55: 4 of 18 wrong on perf 6.1 alone), so
a rule names a function only where it was right on real code: for each rule,
benchmarks/mutants/loco.py counts how often its answer was right and wrong on the
mutants of every codebase (a leave-one-codebase-out run shows how that transfers), and
writes calibration.json beside this file.  A rule is trusted when its smoothed error,
(wrong + 1/2) / (right + wrong + 1), is at most 5 %: 9 right and none wrong, 28 right
and one wrong.  A FOUND verdict whose rule is not trusted becomes "unknown", and the
function is kept as a candidate with the rule's record, so the user still sees it.

Rules measured against good runs (`good-runs*`) come from `--baseline` answers, the
others from runs judged alone: a group a baseline comparison does not change keeps its
own verdict, already calibrated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from refcntd.analysis.attribution import FOUND, UNKNOWN
from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import LeakGroup
from refcntd.analysis.pathops import Culprit, frame_name

TABLE = Path(__file__).with_name("calibration.json")
BAR = 0.05  # the largest smoothed share of wrong answers a trusted rule may have
# benchmarks/mutants/loco.py measures the rules on answers judged without the table
ENABLED = True
# REFCNTD_CALIBRATION=off: every rule names its function (the rules' own tests, which
# check the inference's logic on fixtures; calibration is tested on its own)
ENV = "REFCNTD_CALIBRATION"


def mode_of(rule: str) -> str:
    return "against" if rule.startswith("good-runs") else "alone"


def trusted_counts(right: int, wrong: int) -> bool:
    return (wrong + 0.5) / (right + wrong + 1) <= BAR


@dataclass
class Table:
    """Per rule: (right, wrong, other) answers on real mutants."""

    counts: dict[str, dict[str, tuple[int, int, int]]] = field(
        default_factory=lambda: {"alone": {}, "against": {}})
    codebases: tuple[str, ...] = ()

    @property
    def trusted(self) -> dict[str, set[str]]:
        return {mode: {rule for rule, (r, w, _) in rules.items() if rule and trusted_counts(r, w)}
                for mode, rules in self.counts.items()}

    def trusts(self, rule: str) -> bool:
        """Whether an answer named by `rule` stands (the rule's own kind says where it
        was measured: the module doc)."""
        r, w = self.record(rule)
        return bool(rule) and trusted_counts(r, w)

    def record(self, rule: str) -> tuple[int, int]:
        r, w, _ = self.counts[mode_of(rule)].get(rule, (0, 0, 0))
        return r, w

    @classmethod
    def measure(cls, rows: Iterable[Mapping[str, Any]]) -> Table:
        """From loco.py's rows: each mutant's answers alone and against good runs."""
        table = cls()
        seen = set()
        for row in rows:
            seen.add(str(row["codebase"]))
            for mode in ("alone", "against"):
                rule, outcome = row[mode]["rule"], row[mode]["outcome"]
                if not rule or mode_of(rule) != mode:
                    continue  # an alone verdict kept against good runs is counted alone
                r, w, o = table.counts[mode].get(rule, (0, 0, 0))
                table.counts[mode][rule] = (r + (outcome == "right"), w + (outcome == "wrong"),
                                            o + (outcome not in ("right", "wrong")))
        table.codebases = tuple(sorted(seen))
        return table

    def dump(self) -> str:
        return json.dumps({"bar": BAR, "codebases": list(self.codebases),
                           "rules": {mode: {rule: list(c) for rule, c in sorted(rules.items())}
                                     for mode, rules in self.counts.items()}},
                          indent=1) + "\n"

    @classmethod
    def parse(cls, text: str) -> Table:
        doc = json.loads(text)
        return cls({mode: {rule: (int(c[0]), int(c[1]), int(c[2])) for rule, c in rules.items()}
                    for mode, rules in doc["rules"].items()}, tuple(doc.get("codebases", ())))


@cache
def shipped() -> Table:
    """The table measured on every codebase of benchmarks/mutants (calibration.json)."""
    return Table.parse(TABLE.read_text(encoding="utf-8")) if TABLE.exists() else Table()


def calibrate(groups: Iterable[LeakGroup], table: Table | None = None) -> None:
    """A FOUND verdict named by a rule the table does not trust becomes unknown, its
    function kept as a candidate with the rule's record."""
    if not ENABLED or os.environ.get(ENV) == "off":
        return
    table = table or shipped()
    if not table.codebases:
        return  # no table measured: every rule names its function, as before calibration
    for group in groups:
        v = group.verdict
        if v is None or v.status != FOUND or not group.culprits:
            continue
        top = group.culprits[0]
        if not top.rule or table.trusts(top.rule):
            continue
        group.verdict = untrusted(v, top, table)
        group.culprits = []


def untrusted(v: Verdict, top: Culprit, table: Table) -> Verdict:
    right, wrong = table.record(top.rule)
    record = (f"right {right} and wrong {wrong} time(s) on the real mutants of "
              f"{len(table.codebases)} codebases" if right + wrong else
              "never measured on real mutants")
    reason = (f"candidate: {top.kind} in {frame_name(top.function)}, by the rule "
              f"'{top.rule}' ({top.evidence}), which was {record}: not named, the rule is "
              f"below the bar of {BAR:.0%} wrong (docs/culprits.md); {top.why}")
    return Verdict(UNKNOWN, reason, [], v.notes, candidates=(frame_name(top.function),))
