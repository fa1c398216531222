"""Real-code mutation benchmark for refcntd's culprit (issue 31).

Real codebases built from Debian's sources (perf from linux-source-6.12
with the 2015 refcnt stubs; GStreamer core, fontconfig, libxkbcommon and
libdbus-1 from `apt-get source`: codebases.py; HarfBuzz and cairo, issue 55:
harfbuzz.py, cairo.py).  Each mutant deletes one put
call or adds one get at a call site the codebase's workload executes
(measured with ftrace uprobes on the unmutated build), one mutant per
incremental build.  Truth: the mutated
function, and the new leaked objects per type counted by plain ftrace uprobe
events (mutants that leak no new object are "equivalent").  Each leaking
mutant is run under `refcntd run --history all --json` --repeats times and
scored (right, tie, unknown, wrong, missed); repeats that disagree are
reported as nondeterministic.

Every refcntd run is kept under DIR/runs/ (its --json and, beside it, the
inference's inputs from REFCNTD_DUMP_EVIDENCE), so `rescore` judges the
saved runs again with the current inference in seconds, without a build or
a trace, and writes DIR/rescored.json and DIR/rescored.md.

`compare --before A.json --after B.json` prints both scores and what changed.

`repeat` rebuilds the first --limit scored mutants of each codebase and runs
refcntd --repeats times on each: the verdicts of repeated runs must agree.

`retruth` counts the truth again (baselines and every scored mutant, rebuilt
but not traced by refcntd) after the truth's probes changed.

`rebase` runs refcntd on the unmutated builds again, --repeats runs per
workload (runs kept that carry each type's operations per path stay): what
`against` compares every mutant's run with (a culprit found against good
runs, --baseline).

`against` scores every mutant's newest kept run against its workload's
baseline runs (--repeats of them), as `refcntd report --baseline` judges it,
beside the same run alone: OUT/against.json and OUT/against.md.

Usage (root):  benchmarks/mutants/mutants.py
               prepare|sites|run|smoke|rescore|compare|repeat|retruth|rebase|against
               [--codebase perf|perf61|gstreamer|fontconfig|xkbcommon|dbus|glib|harfbuzz|cairo|all]
               [--out DIR] [--limit N] [--repeats R] [--baselines B] [--timeout S]
Results: DIR/mutants.json and DIR/mutants.md; across codebases, loco.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import against
import codebases
import perf61  # noqa: F401  (registers perf 6.1, issue 55's judge)
import repeat
import report
import rescore
import runner

DEFAULT_OUT = Path("/var/tmp/refcntd-mutants")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("prepare", "sites", "run", "smoke", "rescore",
                                           "compare", "repeat", "retruth", "rebase", "against"))
    ap.add_argument("--codebase", choices=(*codebases.CODEBASES, "all"), default="all")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help="sources, builds, caches and results (default %(default)s)")
    ap.add_argument("--limit", type=int, default=0, help="at most N mutants per codebase")
    ap.add_argument("--repeats", type=int, default=2, help="refcntd runs per mutant")
    ap.add_argument("--baselines", type=int, default=0,
                    help="run: refcntd runs of each used workload's unmutated build (default "
                         "--repeats; `against --repeats N` compares with N of them)")
    ap.add_argument("--seconds", type=int, default=0,
                    help="stop starting new mutants after this long (0: no limit)")
    ap.add_argument("--timeout", type=int, default=runner.REFCNTD_TIMEOUT,
                    help="seconds one refcntd run may take (default %(default)s)")
    ap.add_argument("--retry-timed-out", action="store_true",
                    help="run: run again the mutants whose refcntd run timed out")
    ap.add_argument("--retry-missed", action="store_true",
                    help="run: run again the mutants whose outcome was 'missed'")
    ap.add_argument("--exclude", type=Path, action="append", default=[],
                    help="run: skip the mutants of this results JSON (held out: sites "
                         "never tried before)")
    ap.add_argument("--before", type=Path, help="compare: the rescored JSON judged first")
    ap.add_argument("--after", type=Path, help="compare: the rescored JSON judged second")
    args = ap.parse_args(argv)
    if args.command == "compare":
        if not (args.before and args.after):
            ap.error("compare needs --before and --after")
        docs = [json.loads(p.read_text()) for p in (args.before, args.after)]
        print(report.compare(*docs), end="")
        return 0
    runner.REFCNTD_TIMEOUT = args.timeout
    names = list(codebases.CODEBASES) if args.codebase == "all" else [args.codebase]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "rescore":
        return rescore.main(args.out)
    if args.command == "against":
        return against.main(args.out, args.repeats)
    if args.command == "smoke":
        return runner.smoke(args.out, args.repeats)
    if args.command == "repeat":
        return repeat.main(args.out, names, args.limit or 10, args.repeats)
    loaded = [codebases.load(n, args.out) for n in names]
    if args.command == "prepare":
        for cb in loaded:
            print(f"{cb.name}: {cb.prepared}")
        return 0
    if args.command == "retruth":
        return runner.retruth(loaded, args.out)
    if args.command == "rebase":
        return runner.rebase(loaded, args.out, args.repeats)
    if args.command == "sites":
        for cb in loaded:
            runner.executed_sites(cb, verbose=True)
        return 0
    excluded = {m["id"] for p in args.exclude for m in json.loads(p.read_text())["mutants"]}
    return runner.run_all(loaded, args.out, args.limit, args.repeats, args.seconds,
                          args.retry_timed_out, args.retry_missed, excluded,
                          args.baselines or args.repeats)


if __name__ == "__main__":
    sys.exit(main())
