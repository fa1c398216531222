"""Where a user waits (issue 43, part 2): the first `run` on a real perf, `attach` to
attached, and a fork-heavy CI run, each against the same work untraced.

    sudo .venv/bin/python benchmarks/waiting.py [--repeats N] [--perf PERF --data DATA]

* first `run -- perf report`: a perf built with the refcount stubs and `-g` (the
  mutants benchmark's build of linux-source-6.12, benchmarks/mutants/) on its
  `perf record` file, in a cache as `refcntd prebuild` leaves it with nothing about
  perf in it (prebuild's BPF program, kernel headers and the CFI tables of libc and
  ld.so stay; every other file is removed before each start); minus `perf report`
  untraced;
* `attach --binary` of the same perf, default spec: from start to "attached", with
  the analysis caches emptied (cold) and kept (warm);
* fork-heavy CI: `refcntd run -- sh -c 'seq N | xargs -P 4 -I{} perflike 10'` (8
  leaks each), N = 200 and N = 20, untraced and traced alternately; the cost a
  process is the slope (traced(200) - traced(20)) / 180, the whole run's extra time
  over 200 beside it; every report is checked (8 objects per perflike).

The per-call rows (init+release with its allocation stack, --history) are
`run.py --per-call`'s (results/per-call.md).  `--tree` runs another checkout's refcntd
(`python -m refcntd` there) as a baseline.  Adds the run to results/waiting.json under
"runs" -> LABEL (a run of the same label replaced, the others kept); the page
(results/waiting.md) is written by hand from those runs with the profiles, and names the
labels it cites.
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

from bigsource import count_dies  # noqa: E402
from run import git_head, machine  # noqa: E402

MUTANTS = Path("/var/tmp/refcntd-mutants/perf")
REFCNTD = [sys.executable, "-m", "refcntd"]
PERFLIKE_LEAKS = 8
TREE = [ROOT]  # whose refcntd runs (`python -m refcntd` in that checkout): --tree


def timed(cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)
          ) -> float:
    t0 = time.monotonic()
    status = subprocess.run(cmd, cwd=TREE[0], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL).returncode
    if status not in ok:
        raise RuntimeError(f"{cmd[:6]} exited {status}")
    return time.monotonic() - t0


def files(cache: Path) -> set[Path]:
    return {p for p in cache.rglob("*") if p.is_file()}


PREBUILT: set[Path] = set()  # what `refcntd prebuild` left: every start finds it


def empty_analysis(cache: Path) -> None:
    """Back to what prebuild left: no analysis, CFI table or plan of perf or perflike."""
    for path in files(cache) - PREBUILT:
        path.unlink()


def first_run(perf: Path, data: Path, cache: Path, repeats: int) -> dict:
    report = [str(perf), "report", "-i", str(data), "--stdio", "-g", "none", "--no-children"]
    env = dict(os.environ, REFCNTD_CACHE=str(cache))
    untraced, traced = [], []
    for _ in range(repeats):
        untraced.append(timed(report))
        empty_analysis(cache)
        traced.append(timed([*REFCNTD, "run", "--spec", "perf-stubs", "--", *report], env,
                            (0, 23)))
    return summary(traced, untraced)


def attach_start(perf: Path, cache: Path, repeats: int) -> dict:
    env = dict(os.environ, REFCNTD_CACHE=str(cache))
    out: dict[str, list[float]] = {"cold": [], "warm": []}
    for _ in range(repeats):
        for kind in out:
            if kind == "cold":
                empty_analysis(cache)
            t0 = time.monotonic()
            proc = subprocess.Popen([*REFCNTD, "attach", "--binary", str(perf)], cwd=TREE[0],
                                    env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            assert proc.stderr is not None
            while "attached" not in (line := proc.stderr.readline()):
                if not line:
                    raise RuntimeError("refcntd attach ended before attached")
            out[kind].append(round(time.monotonic() - t0, 3))
            proc.send_signal(2)
            proc.wait(timeout=60)
    return {k: {"median_s": statistics.median(v), "runs": v} for k, v in out.items()}


def fork_heavy(perflike: Path, cache: Path, repeats: int, scratch: Path) -> dict:
    env = dict(os.environ, REFCNTD_CACHE=str(cache))
    times: dict[str, list[float]] = {}
    for _ in range(repeats):
        for n in (200, 20):
            shell = f"seq {n} | xargs -P 4 -I{{}} {perflike} 10 > /dev/null"
            times.setdefault(f"untraced {n}", []).append(timed(["sh", "-c", shell]))
            out = scratch / f"fork{n}.json"
            times.setdefault(f"traced {n}", []).append(timed(
                [*REFCNTD, "run", "--json", str(out), "--", "sh", "-c", shell], env, (23,)))
            check_reports(out, n)
    med = {k: statistics.median(v) for k, v in times.items()}
    slope = (med["traced 200"] - med["traced 20"]) / 180
    return {"runs": times, "median_s": med, "per_process_ms": round(slope * 1000, 2),
            "whole_run_per_process_ms":
                round((med["traced 200"] - med["untraced 200"]) / 200 * 1000, 2)}


def check_reports(path: Path, n: int) -> None:
    """Every perflike reported once with its 8 leaked objects: a faster run that lost
    reports would not count."""
    procs = [p for p in json.loads(path.read_text())["processes"] if p["comm"] == "perflike"]
    leaks = sorted(p["leaked_objects"] for p in procs)
    if leaks != [PERFLIKE_LEAKS] * n:
        raise RuntimeError(f"{path}: {len(procs)} perflike reports, leaks {set(leaks)}")


def summary(traced: list[float], untraced: list[float]) -> dict:
    t, u = statistics.median(traced), statistics.median(untraced)
    return {"traced_s": round(t, 3), "untraced_s": round(u, 3), "added_s": round(t - u, 3),
            "traced_runs": [round(x, 3) for x in traced],
            "untraced_runs": [round(x, 3) for x in untraced]}


def build_perflike(out: Path) -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples"), f"BUILD={out}",
                    "CFLAGS=-O2 -fno-omit-frame-pointer"], check=True)
    return out / "perflike"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--perf", type=Path, default=MUTANTS / "build" / "perf")
    parser.add_argument("--data", type=Path, default=MUTANTS / "work.data")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="another checkout's refcntd (a baseline), run by this venv")
    parser.add_argument("--label", default="waiting",
                        help="this run's key in results/waiting.json")
    parser.add_argument("--only", choices=("perf", "attach", "fork"), action="append")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("benchmarks/waiting.py: needs root (BPF)", file=sys.stderr)
        return 1
    rows = set(args.only or ("perf", "attach", "fork"))
    TREE[0] = args.tree.resolve()
    with tempfile.TemporaryDirectory(prefix="refcntd-waiting-") as scratch_dir:
        scratch = Path(scratch_dir)
        perf = scratch / "perf"  # a copy: the mutants benchmark rebuilds its own in place
        shutil.copy2(args.perf, perf)
        cache = scratch / "cache"
        subprocess.run([*REFCNTD, "prebuild", "--quiet"], cwd=TREE[0], check=True,
                       env=dict(os.environ, REFCNTD_CACHE=str(cache)))
        PREBUILT.update(files(cache))
        data: dict = {"machine": machine(), "tree": str(TREE[0]),
                      "commit": git_head(TREE[0]), "load_before": os.getloadavg()}
        if "perf" in rows:
            data["perf"] = {"binary": str(args.perf), "dies": count_dies(perf),
                            **first_run(perf, args.data, cache, args.repeats)}
        if "attach" in rows:
            data["attach"] = attach_start(perf, cache, args.repeats)
        if "fork" in rows:
            data["fork"] = fork_heavy(build_perflike(scratch / "build"), cache,
                                      args.repeats, scratch)
        data["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.out / "waiting.json"
    doc = json.loads(page.read_text()) if page.exists() else {"runs": {}}
    doc["runs"][args.label] = data
    page.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
