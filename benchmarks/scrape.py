"""What a scrape and a diff cost `serve` as live objects grow (issue 17).

    sudo .venv/bin/python benchmarks/scrape.py [--smoke] [--out DIR]

Runs serve's own Daemon in this process on tests/fixtures/requests.c (-O2, no
frame pointers: each request leaks one object, at one allocation site), sets a
checkpoint, then grows the live objects to each size and times, median of 3:
a whole scrape (every metric family), a diff (GET /diff's JSON) and, for
comparison, the walk of every live object that scrapes and diffs did before the
kernel counted per site.  Writes scrape.md/.json.
"""

from __future__ import annotations

import argparse
import logging
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

from run import machine, write_results  # noqa: E402

from refcntd.inputs.config import load_config  # noqa: E402
from refcntd.kernel import setup  # noqa: E402


def timed(fn: object, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    sizes = (1_000, 10_000) if args.smoke else (10_000, 100_000, 1_000_000)
    setup.prepare()
    logging.disable(logging.INFO)
    from refcntd.service.daemon import Daemon
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "requests"
        subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", f"-I{ROOT / 'examples'}",
                        "-o", str(exe), str(ROOT / "tests/fixtures/requests.c"),
                        str(ROOT / "examples/refcnt.c")], check=True)
        config = Path(tmp) / "refcntd.yaml"
        config.write_text(f"version: 1\nlisten: 127.0.0.1:1\nreport_dir: {tmp}/reports\n"
                          f"targets:\n  - name: svc\n    path: {exe}\n    spec: perf-stubs\n")
        daemon = Daemon(load_config(str(config)))
        daemon.attach_all()
        (tracer,) = daemon.targets.runtimes["svc"].tracers.values()
        collector = daemon.collector()
        app = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
        try:
            app.stdin.write("1\n")  # the type name's page is present from here on
            app.stdin.flush()
            app.stdout.readline()
            daemon.views.mark()
            done = 1
            for n in sizes:
                start = time.perf_counter()
                app.stdin.write(f"{n - done}\n")
                app.stdin.flush()
                assert app.stdout.readline().strip() == "ok"
                grow_s = time.perf_counter() - start
                done = n
                diff = daemon.views.json(True)
                (process,) = diff["targets"]["svc"]  # type: ignore[index]
                since = sum(g["objects"] for g in process["groups"])
                rows.append({
                    "live_objects": n, "since_checkpoint": since,
                    "grow_s": grow_s,
                    "scrape_s": timed(lambda: list(collector.collect())),
                    "diff_s": timed(lambda: daemon.views.json(True)),
                    "walk_s": timed(lambda: tracer.kernel.objects.live_objects(), 1),
                    "site_entries": tracer.kernel.map_fill()["allocation_sites"][0],
                    "age_bins": tracer.kernel.map_fill()["age_bins"][0],
                    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
                print(rows[-1], flush=True)
        finally:
            app.kill()
            app.wait()
            daemon.shutdown()
    lines = ["# serve: scrape and diff cost against live objects", "",
             f"Machine: {machine()}", "",
             "One process, one leaking allocation site (tests/fixtures/requests.c, -O2, "
             "-fomit-frame-pointer); medians of 3.  `walk` is reading every live object "
             "from the kernel, what each scrape and diff did before the per-site counts.",
             "", "| live objects | since checkpoint | scrape ms | diff ms | walk of every "
                 "object ms | site entries | age bins | peak RSS MiB (walks included) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['live_objects']:,} | {r['since_checkpoint']:,} | "
              f"{r['scrape_s'] * 1e3:.1f} | {r['diff_s'] * 1e3:.1f} | {r['walk_s'] * 1e3:.0f} "
              f"| {r['site_entries']} | {r['age_bins']} | {r['maxrss_mib']:.0f} |"
              for r in rows]
    text = "\n".join(lines) + "\n"
    write_results(args.out, "scrape-smoke" if args.smoke else "scrape", text, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
