"""kindsoracle's repeated runs: a site's verdict from every run of both tools."""

from __future__ import annotations

import sys
from collections import Counter

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from kindsoracle import LATE, compare_runs, repeated_table  # noqa: E402

SITE, OTHER, GONE = ("g_task_new", "libgio-2.0.so+0x7cd12"), ("a", "b"), ("c", "d")
REACH, LOST = "still reachable", "definitely lost"


def test_each_sites_verdict_over_runs():
    ours = [{SITE: Counter({REACH: 2}), OTHER: Counter({LOST: 1}), GONE: Counter({REACH: 1})},
            {SITE: Counter({REACH: 1, LATE: 1}), OTHER: Counter({REACH: 1})}]
    theirs = [{SITE: Counter()}, {SITE: Counter({REACH: 3}), OTHER: Counter({REACH: 1})}]
    rows = {r["site"]: r for r in compare_runs("p", ours, theirs)}
    assert rows[" < ".join(SITE)]["verdict"] == "same kinds"  # the late one not compared
    assert rows[" < ".join(OTHER)]["verdict"] == "differ"  # lost here, never there
    assert rows[" < ".join(OTHER)]["only_refcntd"] == [LOST]
    assert rows[" < ".join(GONE)]["verdict"] == "alive only under refcntd"
    assert rows[" < ".join(GONE)]["refcntd"] == [{REACH: 1}, {}]
    table = repeated_table(list(rows.values()))
    assert "| p | c < d | 1 still reachable / - | - / - | alive only under refcntd |" in table
    assert any("**differ**" in line for line in table)
