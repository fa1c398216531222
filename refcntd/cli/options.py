"""Option groups several commands share (each command adds its own in add_arguments).

Light on purpose: the whole parser is built before `attach` starts its BPF
compile, so nothing here imports an analysis or tracing stage.
"""

from __future__ import annotations

import argparse
import os

from refcntd.cli import argtypes
from refcntd.errors import EXIT_FINDINGS


def spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", action="append", metavar="SPEC",
                   help="bundled spec name or YAML file (default: perf-stubs); given more "
                        "than once, every spec's roles at once (a library's own spec beside "
                        "gobject)")
    p.add_argument("--probe-mode", metavar="MODE",
                   default=os.environ.get("REFCNTD_PROBE_MODE", "auto"),
                   help="where function probes go: auto (default: call sites when the entry "
                        "would be single-stepped and every call is found), entry, callsites; "
                        "or per role, e.g. get=callsites,put=entry (default: "
                        "$REFCNTD_PROBE_MODE, else auto)")


def progress_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--verbose", action="store_true",
                       help="print on stderr where the time goes (analysis, BPF compile, "
                            "probe creation, per-process setup)")
    group.add_argument("--quiet", action="store_true",
                       help="no progress on stderr for long steps")


def ci_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sarif", metavar="FILE", type=argtypes.output_path,
                   help="also write SARIF 2.1.0")
    p.add_argument("--junit", metavar="FILE", type=argtypes.output_path,
                   help="also write JUnit XML")
    p.add_argument("--suppressions", metavar="FILE",
                   help="rules (leak:, type:, anomaly:) for findings that must not fail")
    p.add_argument("--baseline", metavar="OLD.json", action="append", default=[],
                   help="fail only on findings absent from this earlier run or grown "
                        "since (more objects or references); with --history in both runs, "
                        "name the culprits of new leaks against it (again for more good "
                        "runs: growth is beyond the larger, what differs between them noise)")
    p.add_argument("--max-leaks", action="append", default=[], metavar="TYPE=N",
                   help="fail only above N leaked objects of TYPE (* for any type; with "
                        "--baseline, the objects beyond it)")
    p.add_argument("--exitcode", type=argtypes.EXIT_STATUS, default=EXIT_FINDINGS, metavar="N",
                   help=f"exit status when findings fail the run, 0..255 (default {EXIT_FINDINGS})")
    p.add_argument("--strict", action="store_true",
                   help="exit 24 unless the report is exact and readable: also for "
                        "unresolved or truncated stacks, unreadable type names, exits not seen")
    p.add_argument("--source-root", default=".", metavar="DIR",
                   help="the user's source tree: SARIF and annotations point into it "
                        "(default: the current directory)")


def leak_kind_arguments(p: argparse.ArgumentParser) -> None:
    """LeakSanitizer's leak kinds and policy (refcntd/reach/, docs/leak-kinds.md)."""
    p.add_argument("--leak-kinds", action=argparse.BooleanOptionalAction, default=True,
                   help="hold each traced process at libc's _exit and scan its memory "
                        "(the default; --no-leak-kinds: every object alive at exit is a "
                        "leak): objects are 'definitely lost', 'indirectly lost' or 'still "
                        "reachable' as valgrind says; only lost ones fail, and a process "
                        "killed by a signal or ended by _exit without exit() is reported, "
                        "not judged (as LeakSanitizer)")
    verdict_arguments(p)


def verdict_arguments(p: argparse.ArgumentParser) -> None:
    """What of a run with leak kinds fails: `run`'s options, which `report` takes too."""
    p.add_argument("--fail-on", action="append", default=[], choices=["reachable"],
                   help="still reachable objects fail the run too")
    p.add_argument("--judge-killed", action="store_true",
                   help="judge the leaks of processes killed by a signal or ended by "
                        "_exit without exit()")


def output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", type=argtypes.output_path,
                   help="also write the report as JSON")
    p.add_argument("--history", nargs="?", const="all", metavar="TYPES",
                   help="keep each object's get/put stacks and name the likely culprit of "
                        "each leak: 'all' (the default when given) or a comma-separated "
                        "list of type names; costs a stack walk per get/put")
    p.add_argument("--history-depth", type=argtypes.HISTORY_DEPTH, default=16, metavar="N",
                   help="operations kept per object, oldest first (power of two, "
                        "4..256; default 16); the rest are counted as dropped")
    p.add_argument("--max-objects", type=argtypes.MAX_OBJECTS, default=1 << 20,
                   help="object map capacity, 1..4194304 (default 1048576)")
    p.add_argument("--max-stacks", type=argtypes.MAX_STACKS, default=8192,
                   help="stack store capacity, 1..262144 (default 8192 distinct stacks)")
