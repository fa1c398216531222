"""`refcntd report RUN.json`: render a saved run again, in any format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from refcntd.cli import argtypes
from refcntd.cli.options import ci_arguments, verdict_arguments
from refcntd.outputs.formats import LOCATED, RENDERERS

HELP = "render a saved run (--json) again"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_json", metavar="RUN.json")
    parser.add_argument("--format", choices=tuple(RENDERERS), default="text",
                        help="folded: stacks for flame graphs; pprof: a gzip'd profile "
                             "for go tool pprof, Parca, Pyroscope; html: one offline page")
    parser.add_argument("--output", metavar="FILE", type=argtypes.output_path,
                        help="write there instead of stdout")
    ci_arguments(parser)
    verdict_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from refcntd.cli.common import (
        ci_outputs,
        emit,
        judge_against_baseline,
        run_exit_status,
        warn_unlocated,
    )
    from refcntd.outputs.policy import Policy
    from refcntd.outputs.runjson import load_run
    result = load_run(args.run_json)
    policy = Policy.build(args.suppressions, args.baseline, args.max_leaks)
    policy.lsan = result.leak_kinds  # as `run` judged it
    policy.fail_on_reachable = "reachable" in args.fail_on
    policy.judge_killed = args.judge_killed
    judge_against_baseline(result, policy, sys.stderr)
    verdict = policy.evaluate(result)
    root = Path(args.source_root)
    if args.format in LOCATED and not args.sarif:  # else ci_outputs warns
        warn_unlocated(result, verdict, root)
    emit(RENDERERS[args.format](result, verdict, root), args.output)
    ci_outputs(result, verdict, args, sys.stderr, annotate=False)
    return run_exit_status(result, verdict, args.exitcode, args.strict)
