"""serve on real GStreamer pipelines (issue 58 item 6): the gst soak's short version
(benchmarks/gstsoak.py --short) and its invariants, not its timings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import ROOT
from test_serve_scope import gst_launch


def test_short_gst_soak_invariants(bpf, tmp_path):
    """3 minutes of Debian's gst-launch-1.0 (audio and video, live) under serve on the
    bundled gstreamer spec, each pipeline restarted once, a GET /leaks each minute.
    Each run's objects alive at exit must be as many as GStreamer's own leaks tracer
    lists at gst_deinit() in the same process (which must have listed live objects at
    a SIGUSR1 just before: a tracer that printed nothing proves nothing)."""
    # a copy of Debian's program: a target on /usr/bin would also trace (and stop for
    # its scans) other users' pipelines on this host, and theirs ours
    program = tmp_path / "gst-launch-1.0"
    shutil.copy(gst_launch(), program)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gstsoak.py"), "--short",
                           "--program", str(program), "--out", str(out),
                           "--work", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=420, cwd=ROOT)
    assert (out / "gst-soak.json").exists(), proc.stderr[-3000:]
    result = json.loads((out / "gst-soak.json").read_text())
    judged = {v["goal"]: v for v in result["verdict"]
              if not v["goal"].startswith(("RSS", "every scrape"))}
    end = result["end"]
    assert all(v["met"] for v in judged.values()), json.dumps([judged, end], indent=1)
    runs = end["runs"]
    # each pipeline restarted once: its first run checked at the restart, its second
    # at the end
    assert sorted((r["kind"], r["run"]) for r in runs) == [
        ("audio", 1), ("audio", 2), ("video", 1), ("video", 2)], runs
    for r in runs:
        assert r["exit"] == 0 and r["reports"] == 1 and r["tracer_live_at_usr1"] > 0, r
        assert sum(r["refcntd_at_exit"].values()) == sum(r["tracer_at_exit"].values()), r
    assert [sorted(row["leaks"]["scanned"]) for row in result["rows"]] == \
        [["audio", "video"]] * 3
