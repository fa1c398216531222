"""The real-code mutation benchmark's truth machinery, on three perf mutants.

`benchmarks/mutants/mutants.py smoke` runs a deleted thread__put, a deleted
map__put and an added dso__get from perf's report path.  Its builds are
cached in SMOKE_DIR: the first run extracts linux-source-6.12's tools/perf,
applies the stub patch and builds perf (minutes); later runs reuse the
binaries.  Checked: the independent ftrace count sees each mutant leak
objects of the mutated type, and refcntd reports a new leak of that type.
The culprit score itself is not asserted: it is the number being improved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SMOKE_DIR = Path("/var/tmp/refcntd-mutants-smoke")


def test_mutants_smoke(bpf):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/mutants/mutants.py"), "smoke",
                           "--out", str(SMOKE_DIR)], capture_output=True, text=True,
                          timeout=3600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((SMOKE_DIR / "smoke" / "smoke.json").read_text())["smoke"]
    assert [(r["pattern"], r["type"]) for r in rows] == [
        ("put deleted", "thread"), ("put deleted", "map"), ("get added", "dso")]
    for r in rows:
        assert r["truth_lost"] == 0, r
        assert r["new_leaks"].get(r["type"], 0) > 0, r  # ftrace: the mutant leaks
        assert r["type"] in r["refcntd_types"], r  # refcntd: a new leak of that type
        assert r["outcome"] in ("right", "tie", "unknown", "wrong"), r  # not missed
