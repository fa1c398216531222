"""The first `refcntd run` on a big binary: how long until the program runs traced.

    sudo .venv/bin/python benchmarks/coldstart.py [--smoke] [--repeats N] [--before TREE]

Issue 27's goal: with an empty cache, the first `run` on a perf-sized binary is ready
in 4 s or less.  No perf binary with refcount stubs and debug info exists here
(Debian's /usr/bin/perf 6.1 is stripped, exports 24 functions and has none of the
stubs), so the binary is the generated one of benchmarks/bigbinary.py: 1.08M DWARF
DIEs, every function calling a stub (24 180 call sites).  Each start is a fresh
process, in one of two caches:

* "prebuilt": what scripts/setup.sh leaves (`refcntd prebuild`: the compiled BPF
  program, the merged kernel headers, the BTF offsets); the binary's analysis caches
  (DWARF answers, call-site sweep, ld.so plan) are emptied before each start;
* "empty": a new cache directory each time: the kernel-header merge, the BPF compile
  and the whole analysis.

Ready: from the start to refcntd's `per-process setup` line (--verbose), printed when
the probes are installed and the command is let go; also the whole run's wall time
minus the program's own (median of 3 untraced runs), for the program's time
subtracted.  With --before TREE, the same starts of an older checkout (its own
prebuild).  Writes coldstart.md and coldstart.json into --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bigsource  # noqa: E402
from run import machine  # noqa: E402

KEPT = ("bpf", "kernel-headers", "btf-offsets-")  # what `refcntd prebuild` leaves
READY = "per-process setup"


def start(tree: Path, exe: Path, cache: Path) -> dict[str, object]:
    """One `refcntd run --verbose -- exe 1`: seconds to ready, to exit, its stages."""
    env = dict(os.environ, REFCNTD_CACHE=str(cache))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "refcntd", "run", "--verbose", "--",
                             str(exe), "1"], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    ready, stages = None, []
    for line in proc.stderr:
        if ready is None:
            stages.append(line.rstrip())
            if READY in line:
                ready = time.monotonic() - t0
    status = proc.wait()
    total = time.monotonic() - t0
    if ready is None or status not in (0, 23):
        raise RuntimeError(f"refcntd run ended with {status} before ready: {stages[-5:]}")
    return {"ready_s": round(ready, 3), "total_s": round(total, 3), "stages": stages}


def empty_analysis(cache: Path) -> None:
    for entry in cache.iterdir():
        if not entry.name.startswith(KEPT):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def untraced(exe: Path) -> float:
    runs = []
    for _ in range(3):
        t0 = time.monotonic()
        subprocess.run([str(exe), "1"], check=True, stdout=subprocess.DEVNULL)
        runs.append(time.monotonic() - t0)
    return statistics.median(runs)


def measure(trees: list[tuple[str, Path]], exe: Path, program_s: float, repeats: int
            ) -> list[dict]:
    """Each tree's starts, interleaved (the machine's load drifts), `repeats` of each."""
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="refcntd-cold-") as scratch:
        dirs = {label: Path(scratch) / label.replace(" ", "-") for label, _ in trees}
        for label, tree in trees:
            subprocess.run([sys.executable, "-m", "refcntd", "prebuild", "--quiet"], cwd=tree,
                           env=dict(os.environ, REFCNTD_CACHE=str(dirs[label])), check=True)
        for i in range(repeats):
            for kind in ("prebuilt", "empty"):
                for label, tree in trees:
                    cache = dirs[label]
                    if kind == "prebuilt":
                        empty_analysis(cache)
                    else:
                        cache = cache.with_name(f"{cache.name}-empty-{i}")
                    runs.setdefault((label, kind), []).append(start(tree, exe, cache))
    return [row(label, kind, done, program_s) for (label, kind), done in runs.items()]


def row(label: str, cache_kind: str, runs: list[dict], program_s: float) -> dict:
    ready = sorted(float(r["ready_s"]) for r in runs)
    net = sorted(float(r["total_s"]) - program_s for r in runs)
    return {"refcntd": label, "cache": cache_kind, "runs": len(runs),
            "ready_s": statistics.median(ready), "ready_range": f"{ready[0]}-{ready[-1]}",
            "total_minus_program_s": round(statistics.median(net), 3),
            "stages": runs[-1]["stages"]}


def render(data: dict) -> str:
    lines = ["# First `refcntd run` on a big binary (issue 27: ready <= 4 s, empty cache)", "",
             f"Machine: {data['machine']}", "",
             f"Binary: benchmarks/bigsource.py {data['shape']}, {data['dies']:,} DWARF DIEs "
             f"(`gcc -g -O2`), `bigprog 1` untraced {data['program_s']:.3f} s.", "",
             "Load average (1, 5, 15 min) before and after the runs: "
             f"{data['load_average'][:3]} -> {data['load_average'][3:]}: other work on the "
             "machine's CPUs stretches every figure.", "",
             "| refcntd | cache | runs | ready s (median) | range | whole run minus the "
             "program's own s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['refcntd']} | {r['cache']} | {r['runs']} | {r['ready_s']} | "
              f"{r['ready_range']} | {r['total_minus_program_s']} |" for r in data["rows"]]
    for r in data["rows"]:
        lines += ["", f"{r['refcntd']}, {r['cache']} cache, --verbose (last run):"]
        lines += [f"    {stage}" for stage in r["stages"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny program (seconds)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", type=Path, help="an older refcntd checkout, as baseline")
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) /
                        "refcntd-bigbuild", help="where to build the binary (kept)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("benchmarks/coldstart.py: needs root (BPF)", file=sys.stderr)
        return 1
    shape = bigsource.SMOKE if args.smoke else bigsource.FULL
    exe = bigsource.build(args.build / ("smoke" if args.smoke else "full"), shape)
    program_s = untraced(exe)
    trees = [("this tree", ROOT), *([("before", args.before)] if args.before else [])]
    load_before = os.getloadavg()
    rows = measure(trees, exe, program_s, args.repeats)
    data = {"machine": machine(), "shape": vars(shape), "dies": bigsource.count_dies(exe),
            "program_s": program_s, "rows": rows,
            "load_average": [round(x, 1) for x in (*load_before, *os.getloadavg())]}
    stem = "coldstart-smoke" if args.smoke else "coldstart"
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(data)
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
