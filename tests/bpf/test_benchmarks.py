"""The benchmark command runs (smoke size) and its JSON has every row and goal."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from conftest import ROOT

ROWS = {
    "no tracer (-O0 stubs)", "uprobe floor: empty program, same instructions",
    "refcntd counting", "refcntd counting + --history", "no tracer (-O2 lock-prefixed stubs)",
    "uprobe floor on the -O2 build's probe points", "refcntd counting, -O2 lock-prefixed stubs",
    "USDT probes, semaphore off (not traced)", "refcntd on USDT probes, semaphore on",
    "init+release pair, no tracer",
    "init+release pair, refcntd run (allocation stack per init)",
    "refcntd attach counting (per-site and age counts, as serve)",
    "init+release pair, refcntd attach (per-site and age counts)",
    "LD_PRELOAD interposer (user-space hash), PLT stubs", "malloc/free, no tracer",
    "bcc memleak (-p PID) on malloc/free", "2 threads sharing 4 objects, refcntd counting",
    "uprobe floor on the -O2 build's entry probes (single-stepped)",
    "refcntd counting, -O2 stubs, --probe-mode entry",
    "uprobe floor on the exported -O2 stubs' PLT call sites",
    "refcntd counting, -O2 stubs exported by a library (PLT callers)",
}


def test_benchmark_smoke(bpf, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/run.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["name"] for r in data["rows"]} == ROWS
    assert all(r["median"] > 0 and r["runs"] == 1 for r in data["rows"])
    threads = next(r for r in data["rows"] if r["name"].startswith("2 threads"))
    assert threads["counts_exact"] is True
    assert [s["leaked_reported"] for s in data["scale"]] == [s["objects"] for s in data["scale"]]
    assert len(data["goals"]) == 8
    exported = next(r for r in data["rows"] if r["name"].startswith("uprobe floor on the exp"))
    assert re.search(r"get: \d+ call sites \(emulated\)", exported["note"]), exported  # PLT
    assert [a["call_sites"] for a in data["attach_sites"]] == [10, 30]
    assert all(a["probes"] == a["call_sites"] for a in data["attach_sites"])
    assert (tmp_path / "results.md").read_text().startswith("# refcntd benchmark results")


def test_unwind_benchmark_smoke(bpf, tmp_path):
    """CFI vs frame-pointer rows and the table sizes: every depth reported in full."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/unwind.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "unwind.json").read_text())
    assert len(data["stacks"]) == 9 and set(data["ratios"]) == {"8", "16", "32"}
    for row in data["stacks"]:
        assert row["ns_per_pair"] > 0 and row["bpf_ns_per_pair"] > 0
        if row["case"] == "no frame pointers, CFI":  # the walk reaches _start at every depth
            assert row["frames_reported"] == row["depth"] and "truncated_at" not in row["unwind"]
    assert {t["module"] for t in data["tables"]} >= {"libc", "libgobject"}
    assert all(t["rows"] > 0 for t in data["tables"] if not t.get("missing"))


def test_bigpprof_benchmark_smoke(bpf, tmp_path):
    """pprof at exit, from the saved run and live: each profile holds exactly N objects
    (the benchmark checks), and every figure is there."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/bigpprof.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "bigpprof-smoke.json").read_text())["rows"]
    assert row["objects"] == 1000 and row["pprof_kib"] < 4
    assert all(row[k] > 0 for k in ("exit_to_pprof_s", "report_pprof_s", "report_text_s",
                                    "report_html_s", "live_pprof_s", "live_maxrss_mib"))


def test_scrape_benchmark_smoke(bpf, tmp_path):
    """serve's scrape and diff against live objects: the diff's count is exact and the
    kernel keeps a few entries per site, however many objects."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/scrape.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "scrape-smoke.json").read_text())["rows"]
    assert [(r["live_objects"], r["since_checkpoint"]) for r in rows] == [(1000, 999),
                                                                         (10000, 9999)]
    assert all(r["site_entries"] <= 8 and r["scrape_s"] > 0 for r in rows)
