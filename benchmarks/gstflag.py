"""Before and after in the same minutes (issue 58 item 7, GstObject's may-be-leaked
flag read at the scan instead of by a `check` probe on each gst_object_* call):
gstcost.py's `traced` and `untraced` windows against a serve of this tree and of
another checkout (`--before`, main's), the two alternated round by round, each round
starting its serve afresh (serves of both at once would each trap in every pipeline).

    sudo .venv/bin/python benchmarks/gstflag.py --before /work/wt-base [--rounds 4]
        [--window 30] [--out DIR]

The other tree runs through this venv with its PYTHONPATH (its own code, configs and
BPF source).  Per window: each pipeline's CPU ticks, serve's on_probe runs a second
(every uprobe hit of that serve on the host: the untraced window's are the background)
and the operations serve counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gstcost import STATS, Serve, _med, arm_setup, window  # noqa: E402
from gstpipes import PIPELINES  # noqa: E402
from run import machine  # noqa: E402

ARMS = ("traced", "untraced")


def round_of(tree: Path, n: int, args: argparse.Namespace) -> list[dict]:
    """One serve of `tree`, its two windows."""
    with tempfile.TemporaryDirectory(prefix="gstflag-") as tmp:
        serve = Serve(Path(tmp), None, tree)
        try:
            arms = arm_setup(Path(tmp), serve.program)
            return [{"tree": str(tree), "round": n, **window(serve, arm, arms[arm],
                                                               args.warm, args.window)}
                    for arm in (ARMS if n % 2 else ARMS[::-1])]
        finally:
            serve.stop()


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for tree in dict.fromkeys(r["tree"] for r in rows):
        for arm in ARMS:
            mine = [r for r in rows if r["tree"] == tree and r["arm"] == arm]
            probe = [r["bpf"].get("on_probe", {}).get("runs_per_s", 0) for r in mine]
            out.append({"tree": tree, "arm": arm, "windows": len(mine),
                        "ticks": {k: _med([r["ticks"][k] for r in mine]) for k in PIPELINES},
                        "on_probe_runs_per_s": _med(probe),
                        "load": _med([r["load"] for r in mine])})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--window", type=float, default=30)
    parser.add_argument("--warm", type=float, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if not (args.before / "refcntd" / "__init__.py").exists():
        print(f"gstflag.py: {args.before} is not a refcntd checkout", file=sys.stderr)
        return 2
    commits = {str(t): subprocess.run(["git", "-C", str(t), "describe", "--always", "--dirty"],
                                      capture_output=True, text=True).stdout.strip()
               for t in (args.before, HERE.parent)}
    started, was, rows = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), \
        STATS.read_text().strip(), []
    STATS.write_text("1")
    try:
        for n in range(args.rounds):
            trees = (args.before, HERE.parent)
            for tree in trees if n % 2 == 0 else trees[::-1]:
                rows += round_of(tree, n + 1, args)
                print(json.dumps(rows[-2:]), flush=True)
    finally:
        STATS.write_text(was)
    result = {"machine": machine(), "commits": commits, "started_utc": started,
              "ended_utc": time.strftime("%H:%M:%S", time.gmtime()), "window_s": args.window,
              "load_at_end": os.getloadavg(), "rows": rows, "summary": summary(rows)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gst-flag.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
