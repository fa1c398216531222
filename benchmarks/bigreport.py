"""Reports at scale: exit -> text report and -> JSON with 100k and 1M live objects.

    sudo .venv/bin/python benchmarks/bigreport.py [--smoke] [--out DIR]

Runs `refcntd run --json` on `bench live N` (benchmarks/bench.c) through
run.py's scale(), which reads the exit time the program prints and the time
the SUMMARY line and the JSON file appear.  Writes bigreport.md/.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import build, machine, scale, write_results  # noqa: E402

GOALS = {"exit_to_report_s": 2.0, "exit_to_run_json_s": 5.0, "maxrss_mib": 1024.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    sizes = (1000,) if args.smoke else (100_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))["bench-O0"]
        rows = [scale(exe, n, Path(tmp)) for n in sizes]
    lines = ["# refcntd reports at scale", "", f"Machine: {machine()}", "",
             "| live objects at exit | exit -> report s | exit -> JSON s | refcntd peak RSS "
             "MiB | JSON MiB |", "|---|---|---|---|---|"]
    lines += [f"| {r['objects']:,} | {r['exit_to_report_s']:.2f} | "
              f"{r['exit_to_run_json_s']:.2f} | {r['maxrss_mib']:.0f} | {r['run_json_mib']} |"
              for r in rows]
    big = rows[-1]
    lines += ["", "Goals at the largest size: " + ", ".join(
        f"{k} <= {v}: {'met' if big[k] <= v else 'NOT met'} ({big[k]:.2f})"
        for k, v in GOALS.items())]
    text = "\n".join(lines) + "\n"
    write_results(args.out, "bigreport-smoke" if args.smoke else "bigreport", text, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
