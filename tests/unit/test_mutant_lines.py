"""benchmarks/mutants/score: the named line against a mutant's added get, and the
new leaked objects refcntd counted against the truth's."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))

import score  # noqa: E402

CULPRIT = {"kind": "extra get", "function": "machine__process_fork_event",
           "file": "/build/linux-6.12/tools/perf/util/machine.c", "line": 2110}


@pytest.mark.parametrize(("culprit", "file", "line", "expected"), [
    (CULPRIT, "tools/perf/util/machine.c", 2110, "right"),
    (CULPRIT, "tools/perf/util/machine.c", 2111, "wrong"),
    (CULPRIT, "tools/perf/util/thread.c", 2110, "wrong"),
    (CULPRIT, "util/machine.c", 2110, "right"),
    ({**CULPRIT, "file": "/x/other/machine.c"}, "util/machine.c", 2110, "wrong"),
    ({"kind": "extra get", "function": "f"}, "util/machine.c", 2110, "no line"),
    (None, "util/machine.c", 2110, "no line"),
])
def test_line_outcome(culprit, file, line, expected):
    assert score.line_outcome(culprit, file, line) == expected


def _group(type_name: str, objects: int, path: tuple[str, ...] = ("f",)) -> score.Group:
    return score.Group(type_name, path, objects, "unknown", (), (), ())


def test_new_counts_are_the_mutant_run_minus_the_baseline():
    """What refcntd's run leaked beyond the baseline, per type: compared with the
    truth run's new_leaks (two executions: a timing-dependent leak can differ)."""
    base = [_group("GObject", 3), _group("GObject", 1, ("g",))]
    mutant = [_group("GObject", 4), _group("GObject", 13, ("h",)), _group("pad", 2),
              _group("caps", 1, ("g",))]
    assert score.new_counts(base, mutant) == {"GObject": 13, "caps": 1, "pad": 2}
    assert score.new_counts(base, base) == {}
