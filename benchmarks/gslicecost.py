"""What reading GSlice's slabs adds to a scan (refcntd/reach/gslice.py), on real
GStreamer pipelines: writes results/gslice-cost.md/.json.

    sudo .venv/bin/python benchmarks/gslicecost.py [--rounds N] [--out DIR]

Each pipeline (Debian's gst-launch-1.0, G_SLICE unset as users run it) is started,
left to run 2 s, then stopped with SIGSTOP and scanned `--rounds` times each way,
alternating: with the slabs read and cut, and without (gslice.read_slabs skipped:
the scan as before, a slab one block).  `stopped` is read_process (what holds the
process), `after` is finish (the blocks, the graph and the kinds, once continued).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import machine  # noqa: E402

from refcntd.reach import gslice, scan  # noqa: E402

PIPELINES = {
    "audio": ["audiotestsrc", "!", "audioconvert", "!", "audioresample", "!", "fakesink"],
    "video": ["videotestsrc", "!", "video/x-raw,width=320,height=240", "!", "videoconvert",
              "!", "fakesink"],
}


def one_scan(pid: int, cut: bool) -> dict[str, float | int]:
    patch = mock.patch.object(gslice, "read_slabs", return_value=None) if not cut else \
        mock.patch.object(gslice, "read_slabs", gslice.read_slabs)
    with patch:
        began = time.monotonic()
        out = scan.read_process(pid)
        stopped = time.monotonic() - began
        began = time.monotonic()
        scan.finish(out)
        after = time.monotonic() - began
    slabs = out.slabs
    return {"stopped_ms": 1000 * stopped, "after_ms": 1000 * after, "blocks": out.blocks,
            "reads": out.reads, "slabs": len(slabs.slabs) if slabs else 0,
            "cut": slabs.split if slabs else 0, "whole": slabs.whole if slabs else 0,
            "chunks_in_use": slabs.live if slabs else 0, "chunks_free": slabs.freed if slabs else 0}


def measure(name: str, rounds: int) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "G_SLICE"}
    proc = subprocess.Popen(["gst-launch-1.0", "-q", *PIPELINES[name]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        os.kill(proc.pid, signal.SIGSTOP)
        runs: dict[str, list[dict[str, float | int]]] = {"with": [], "without": []}
        for _ in range(rounds):
            runs["with"].append(one_scan(proc.pid, True))
            runs["without"].append(one_scan(proc.pid, False))
    finally:
        proc.kill()
        proc.wait()
    return {"pipeline": name, "runs": runs}


def median(runs: list[dict[str, float | int]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)


def write(out: Path, rows: list[dict[str, object]], load: tuple[float, float]) -> None:
    """Each run appended to the ones before (the machine is shared: load changes)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gslice-cost.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    runs.append({"machine": machine(), "load": load, "rows": rows})
    path.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    lines = ["# What reading GSlice's slabs adds to a scan", "",
             "`benchmarks/gslicecost.py` (its docstring says how), one table per run."]
    for run in runs:
        lines += table(run)
    (out / "gslice-cost.md").write_text("\n".join(lines) + "\n")


def table(run: dict) -> list[str]:  # type: ignore[type-arg]
    load = run["load"]
    lines = ["", f"Machine: {run['machine']}; load average {load[0]:.1f} before, "
             f"{load[1]:.1f} after.", "",
             "| pipeline | blocks without / with | slabs (cut, whole) | chunks in use / free | "
             "stopped ms without / with (median, min-max) | after ms without / with "
             "(median) |", "|---|---|---|---|---|---|"]
    for row in run["rows"]:
        w, wo = row["runs"]["with"], row["runs"]["without"]
        lines.append(
            f"| {row['pipeline']} | {wo[0]['blocks']} / {w[0]['blocks']} | {w[0]['slabs']} "
            f"({w[0]['cut']}, {w[0]['whole']}) | {w[0]['chunks_in_use']} / "
            f"{w[0]['chunks_free']} | {_spread(wo, 'stopped_ms')} / {_spread(w, 'stopped_ms')} "
            f"| {median(wo, 'after_ms'):.1f} / {median(w, 'after_ms'):.1f} |")
    return lines


def _spread(runs: list[dict[str, float | int]], key: str) -> str:
    values = [float(r[key]) for r in runs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    rows = [measure(name, args.rounds) for name in PIPELINES]
    write(args.out, rows, (before, os.getloadavg()[0]))
    print((args.out / "gslice-cost.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
