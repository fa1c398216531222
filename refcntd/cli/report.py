"""`refcntd report RUN.json`: render a saved run again, in any format."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from refcntd.cli.common import ci_outputs, emit, run_exit_status, warn_unlocated
from refcntd.outputs import report


def cmd_report(args: argparse.Namespace) -> int:
    from refcntd.outputs import ciformats
    from refcntd.outputs.policy import Policy
    from refcntd.outputs.runjson import load_run
    result = load_run(args.run_json)
    verdict = Policy.build(args.suppressions, args.baseline, args.max_leaks).evaluate(result)
    root = Path(args.source_root)
    if args.format in ("sarif", "github") and not args.sarif:  # else ci_outputs warns
        warn_unlocated(result, verdict, root)
    if args.format == "pprof":
        from refcntd.outputs.pprof import run_profile, write_bytes
        write_bytes(run_profile([result]), args.output)
    elif args.format == "html":
        from refcntd.outputs.html import render_html
        text = render_html([result])
    elif args.format == "text":
        text = "".join(report.render_process(p) + "\n" for p in result.processes)
        text += report.render_run(result) + ciformats.verdict_text(verdict)
    elif args.format == "sarif":
        text = json.dumps(ciformats.sarif(result, verdict, root), indent=2) + "\n"
    elif args.format == "folded":
        from refcntd.outputs.folded import folded
        text = folded(result)
    elif args.format == "junit":
        text = ciformats.junit(result, verdict)
    else:
        text = "\n".join(ciformats.github_annotations(result, verdict, root)) + "\n"
        text += ciformats.github_summary(result, verdict)
    if args.format != "pprof":
        emit(text, args.output)
    ci_outputs(result, verdict, args, sys.stderr, annotate=False)
    return run_exit_status(result, verdict, args.exitcode, args.strict)
