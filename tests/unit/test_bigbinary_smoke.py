"""The big-binary benchmark at smoke size: it builds, every DWARF candidate that can
answer agrees with the full walk, and a second check reads the analysis cache."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_bigbinary_benchmark_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/bigbinary.py"), "--smoke",
                           "--no-attach", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "bigbinary-smoke.json").read_text())
    assert data["dies"] > 1000
    found = {r["candidate"]: r["found"] for r in data["candidates"]}
    truth = found["pyelftools full walk (before)"]
    assert truth == [{"function": "obj_get", "count": 3}]
    assert found["libdw via ctypes (chosen)"] == truth
    assert found["pyelftools pruned by DW_AT_sibling"] == truth
    runs = {(r["spec"], r["cache"]): r for r in data["check"]}
    assert runs[("perf-stubs", "cold")]["status"] == 0
    assert runs[("example-objapi", "warm")]["inlined"] is True
    assert [runs[(s, t)]["cached"] for s in ("perf-stubs", "example-objapi")
            for t in ("cold", "warm")] == [False, True, False, True]
    assert not any(r["incomplete"] for r in data["check"])
    assert (tmp_path / "bigbinary-smoke.md").read_text().startswith("# refcntd on a big binary")
