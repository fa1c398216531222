"""pprof (and HTML) at scale: 100 000 and 1 000 000 live objects (issue 32).

    sudo .venv/bin/python benchmarks/bigpprof.py [--smoke] [--out DIR]

Three paths, each checked to hold exactly N objects (the profile decoded with
the protobuf library):

* at exit: `refcntd run --pprof` on `bench live N` (benchmarks/bench.c): the
  time from the program's exit (it prints it) to the profile file, and
  refcntd's peak RSS (the same measure as bigreport.py's JSON);
* again: `refcntd report --format pprof` (and `--format html`, and the text
  format for comparison: all three read the file through the same loader) of
  the run's `--json` file: wall time and peak RSS of that command;
* live: GET /debug/pprof/refcount of serve's daemon, in this process, with N
  live objects of tests/fixtures/requests.c: median of 3, and this process's
  peak RSS (the daemon and its traced maps included).

Goals (like the JSON's): <= 5 s and <= 1 GiB at 1 000 000 objects.  Writes
bigpprof.md/.json; each row carries the load average (1 min) before and after its
measures, since the machine is shared.  `--compare OLD.json` adds a before/after
table of the largest size against an earlier run's rows (another commit's, run the
same way).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from run import REFCNTD, build, machine, write_results  # noqa: E402

from refcntd.outputs.profileproto import message  # noqa: E402

GOAL_S, GOAL_MIB = 5.0, 1024.0
# runs CMD and prints its wall time and its peak RSS (KiB): one child per measure
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
           "print(time.perf_counter() - t, "
           "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, rc)")


def objects_in(data: bytes) -> int:
    profile = message("Profile").FromString(gzip.decompress(data))
    return sum(sample.value[0] for sample in profile.sample)


def measured(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MiB) of CMD, run by a fresh interpreter of its own."""
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.split()
    assert out[2] in ("0", "23"), out
    return float(out[0]), int(out[1]) / 1024


def at_exit(exe: Path, n: int, tmp: Path) -> dict[str, float | int]:
    prof, saved = tmp / f"exit-{n}.pb.gz", tmp / f"exit-{n}.json"
    rows: dict[str, float | int] = {"objects": n, "load_before": os.getloadavg()[0]}
    for flag, path, key in (("--pprof", prof, "exit_to_pprof_s"),
                            ("--json", saved, "exit_to_json_s")):
        proc = subprocess.run([*REFCNTD, "run", "--max-objects", str(max(2 * n, 1 << 20)),
                               flag, str(path), "--", str(exe), "live", str(n)],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 23, proc.stderr[-2000:]
        exit_at = float(re.search(r"exit_at ([0-9.]+)", proc.stdout).group(1))
        rows[key] = path.stat().st_mtime - exit_at
        if flag == "--pprof":
            rows["run_maxrss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert objects_in(prof.read_bytes()) == n
    rows["pprof_kib"] = round(prof.stat().st_size / 1024, 1)
    rows["json_mib"] = round(saved.stat().st_size / 2**20, 1)
    again = tmp / f"again-{n}.pb.gz"
    rows["report_pprof_s"], rows["report_pprof_maxrss_mib"] = measured(
        [*REFCNTD, "report", "--format", "pprof", "--output", str(again), str(saved)])
    assert objects_in(again.read_bytes()) == n
    rows["report_text_s"], rows["report_text_maxrss_mib"] = measured(
        [*REFCNTD, "report", str(saved)])  # the same loader, for comparison
    page = tmp / f"again-{n}.html"
    rows["report_html_s"], rows["report_html_maxrss_mib"] = measured(
        [*REFCNTD, "report", "--format", "html", "--output", str(page), str(saved)])
    rows["html_kib"] = round(page.stat().st_size / 1024, 1)
    rows["load_after"] = os.getloadavg()[0]
    return rows


def live(sizes: tuple[int, ...], tmp: Path) -> list[dict[str, float | int]]:
    from refcntd.inputs.config import load_config
    from refcntd.kernel import setup
    from refcntd.service.daemon import Daemon
    from refcntd.service.liveviews import routes
    setup.prepare()
    logging.disable(logging.INFO)
    exe = tmp / "requests"
    subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", f"-I{ROOT / 'examples'}",
                    "-o", str(exe), str(ROOT / "tests/fixtures/requests.c"),
                    str(ROOT / "examples/refcnt.c")], check=True)
    config = tmp / "refcntd.yaml"
    config.write_text(f"version: 1\nlisten: 127.0.0.1:1\nreport_dir: {tmp}/reports\n"
                      f"targets:\n  - name: svc\n    path: {exe}\n    spec: perf-stubs\n")
    daemon = Daemon(load_config(str(config)))
    daemon.attach_all()
    route = routes(daemon.views)["/debug/pprof/refcount"]
    app = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    rows: list[dict[str, float | int]] = []
    try:
        done = 0
        for n in sizes:
            app.stdin.write(f"{n - done}\n")  # type: ignore[union-attr]
            app.stdin.flush()  # type: ignore[union-attr]
            assert app.stdout.readline().strip() == "ok"  # type: ignore[union-attr]
            done = n
            times, body = [], b""
            for _ in range(3):
                start = time.perf_counter()
                status, _ctype, body = route("GET", "")
                times.append(time.perf_counter() - start)
            assert status == "200 OK" and objects_in(body) == n
            rows.append({"objects": n, "live_pprof_s": statistics.median(times),
                         "live_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                         / 1024})
            print(rows[-1], flush=True)
    finally:
        app.kill()
        app.wait()
        daemon.shutdown()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--compare", type=Path, metavar="OLD.json",
                        help="an earlier bigpprof.json: adds a before/after table")
    args = parser.parse_args()
    before = json.loads(args.compare.read_text()) if args.compare else None
    sizes = (1000,) if args.smoke else (100_000, 1_000_000)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))["bench-O0"]
        rows = [at_exit(exe, n, Path(tmp)) for n in sizes]
        for row, extra in zip(rows, live(sizes, Path(tmp)), strict=True):
            row.update(extra)
    text = table(rows) + (compared(before, rows[-1]) if before else "")
    write_results(args.out, "bigpprof-smoke" if args.smoke else "bigpprof", text, rows)
    return 0


def table(rows: list[dict[str, float | int]]) -> str:
    lines = ["# pprof and HTML at scale", "", f"Machine: {machine()}", "",
             "| live objects | exit -> pprof s | exit -> JSON s | run peak RSS MiB | "
             "report pprof s / MiB | report text s / MiB | report html s / MiB | live pprof s "
             "| serve peak RSS MiB | pprof KiB | HTML KiB | JSON MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    loads = ", ".join(f"{r['objects']:,}: {r['load_before']:.1f} -> {r['load_after']:.1f}"
                      for r in rows if "load_before" in r)
    lines += [f"| {r['objects']:,} | {r['exit_to_pprof_s']:.2f} | {r['exit_to_json_s']:.2f} | "
              f"{r['run_maxrss_mib']:.0f} | {r['report_pprof_s']:.2f} / "
              f"{r['report_pprof_maxrss_mib']:.0f} | {r['report_text_s']:.2f} / "
              f"{r['report_text_maxrss_mib']:.0f} | {r['report_html_s']:.2f} / "
              f"{r['report_html_maxrss_mib']:.0f} | {r['live_pprof_s']:.2f} | "
              f"{r['live_maxrss_mib']:.0f} | {r['pprof_kib']} | {r['html_kib']} | "
              f"{r['json_mib']} |" for r in rows]
    big = rows[-1]
    goals = {"exit_to_pprof_s": GOAL_S, "report_pprof_s": GOAL_S, "live_pprof_s": GOAL_S,
             "run_maxrss_mib": GOAL_MIB, "report_pprof_maxrss_mib": GOAL_MIB,
             "live_maxrss_mib": GOAL_MIB}
    lines += ["", "Goals at the largest size: " + ", ".join(
        f"{k} <= {v}: {'met' if float(big[k]) <= v else 'NOT met'} ({float(big[k]):.2f})"
        for k, v in goals.items())]
    if loads:
        lines += ["", f"Load average (1 min) before -> after each size's file measures: {loads}"]
    return "\n".join(lines) + "\n"


COMPARED = (("exit_to_pprof_s", "exit -> pprof s"), ("run_maxrss_mib", "run peak RSS MiB"),
            ("report_pprof_s", "report pprof s"), ("report_pprof_maxrss_mib", "report pprof MiB"),
            ("report_text_s", "report text s"), ("report_text_maxrss_mib", "report text MiB"),
            ("report_html_s", "report html s"), ("report_html_maxrss_mib", "report html MiB"),
            ("live_pprof_s", "live pprof s"), ("live_maxrss_mib", "serve peak RSS MiB"))


def compared(before: dict, after: dict[str, float | int]) -> str:
    """Before/after at the largest size: `before` is an earlier bigpprof.json."""
    old = next(r for r in before["rows"] if r["objects"] == after["objects"])
    lines = ["", f"## Before and after at {after['objects']:,} objects", "",
             f"Before: {before['machine']}, load {old.get('load_before', 'not recorded')} -> "
             f"{old.get('load_after', 'not recorded')}", "",
             "| measure | before | after |", "|---|---|---|"]
    lines += [f"| {label} | {float(old[k]):.2f} | {float(after[k]):.2f} |" for k, label in COMPARED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
