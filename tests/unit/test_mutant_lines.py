"""benchmarks/mutants/score.line_outcome: the named line against a mutant's added get."""

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
