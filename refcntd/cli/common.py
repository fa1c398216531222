"""What the tracing commands share: the exit status, output files, printers."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.errors import EXIT_FINDINGS, EXIT_INCOMPLETE, UsageError
from refcntd.inputs.safefs import atomic_write
from refcntd.outputs import formats, report, reportjson

# CI formats, policies and saved runs are imported where used: `attach` must
# reach its probes fast (attach time is a benchmark goal).
if TYPE_CHECKING:
    from refcntd.outputs.policy import Policy, Verdict


def run_exit_status(result: RunResult, verdict: Verdict, findings_code: int = EXIT_FINDINGS,
                    strict: bool = False) -> int:
    """Failing findings beat everything; then incompleteness (with `strict`, any gap in
    the report, said on stderr); else the command's status."""
    if verdict.failing():
        return findings_code
    if strict:
        from refcntd.outputs.strict import strict_problems
        problems = strict_problems(result)
        if problems:
            print(f"refcntd: --strict: {'; '.join(problems)}", file=sys.stderr)
            return EXIT_INCOMPLETE
    if not result.tracing.complete:
        return EXIT_INCOMPLETE
    return result.command_status or 0


def emit(text: str | bytes, path: str | None) -> None:
    """To `path` (a link planted there is replaced, not followed), or standard output;
    bytes (a pprof profile) never to a terminal, like gzip."""
    if path is None:
        if isinstance(text, str):
            sys.stdout.write(text)
            return
        if sys.stdout.isatty():
            raise UsageError("a pprof profile is binary: not written to a terminal",
                             "give --output FILE.pb.gz, or redirect standard output")
        sys.stdout.flush()
        sys.stdout.buffer.write(text)
        sys.stdout.buffer.flush()
        return
    try:
        atomic_write(path, text.encode() if isinstance(text, str) else text)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


def ci_outputs(result: RunResult, verdict: Verdict, args: argparse.Namespace,
                stream: TextIO, annotate: bool = True) -> None:
    """--sarif, --junit, and GitHub annotations + step summary under GitHub Actions."""
    from refcntd.outputs import ciformats
    root = Path(args.source_root)
    if args.sarif or (annotate and os.environ.get("GITHUB_ACTIONS") == "true"):
        warn_unlocated(result, verdict, root)
    if args.sarif:
        emit(formats.sarif(result, verdict, root), args.sarif)
    if args.junit:
        emit(formats.junit(result, verdict, root), args.junit)
    if annotate:
        print(ciformats.verdict_text(verdict), file=stream, end="")
        if os.environ.get("GITHUB_ACTIONS") == "true":
            ciformats.write_github(result, verdict, root, sys.stdout)


def warn_unlocated(result: RunResult, verdict: Verdict, root: Path) -> None:
    from refcntd.outputs import ciformats
    warning = ciformats.unlocated_warning(result, verdict, root)
    if warning:
        print(warning, file=sys.stderr)


def printer(stream: TextIO) -> Callable[[ProcessReport], None]:
    def show(p: ProcessReport) -> None:
        if not report.quiet(p):  # said once for all of them at the end (render_run)
            print(report.render_process(p), file=stream, flush=True)
    return show


def judge_against_baseline(result: RunResult, policy: Policy, names: list[str],
                           stream: TextIO) -> None:
    """--baseline OLD.json: the culprits of this run's new leaks, found against those
    runs of the same workload (analysis.regression); what kept it from it, a line each."""
    if not policy.old:
        return
    from refcntd.analysis.regression import against
    for note in against(result, policy.old, " and ".join(names)):
        print(f"refcntd: {note}", file=stream)


def finish_output(result: RunResult, args: argparse.Namespace, stream: TextIO) -> None:
    print(report.render_run(result), file=stream, end="", flush=True)
    if args.json:
        try:
            reportjson.write_json(result, args.json)
        except OSError as err:
            raise UsageError(f"cannot write {args.json}: {err.strerror}") from None
