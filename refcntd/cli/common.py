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
from refcntd.inputs.outputfile import STDOUT, write_output
from refcntd.outputs import formats, report, reportjson

# CI formats, policies and saved runs are imported where used: `attach` must
# reach its probes fast (attach time is a benchmark goal).
if TYPE_CHECKING:
    from refcntd.analysis.baseline import Against
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
    """To `path` (inputs/outputfile.py: a regular file replaced, never through a planted
    link; a device, FIFO or /dev/stdout written in place), or standard output (None or
    `-`); bytes (a pprof profile) never to a terminal, like gzip."""
    if isinstance(text, bytes):
        from refcntd.outputs.pprof import write_bytes
        write_bytes(text, path)
    elif path is None or path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            write_output(path, text.encode())
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
        print(ciformats.verdict_text(result, verdict), file=stream, end="")
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


def baseline_judge(policy: Policy) -> Against | None:
    """What judges each process against the --baseline runs as it exits (`run`)."""
    if not policy.old:
        return None
    from refcntd.analysis.baseline import Against
    return Against(policy.old, " and ".join(policy.names))


def judged(show: Callable[[ProcessReport], None], judge: Against | None, stream: TextIO
           ) -> Callable[[ProcessReport], None]:
    """`show` each process's report once judged against the baselines: the culprit the
    text names is the one the JSON, SARIF and annotations carry."""
    if judge is None:
        return show

    def judge_then_show(p: ProcessReport) -> None:
        notes = judge.judge(p)
        show(p)
        for note in notes:
            print(f"refcntd: {note}", file=stream, flush=True)
    return judge_then_show


def judge_against_baseline(result: RunResult, policy: Policy, stream: TextIO,
                           judge: Against | None = None) -> None:
    """--baseline OLD.json: the culprits of this run's new leaks, found against those
    runs of the same workload (analysis.baseline), unless `judge` judged each process
    as it exited; what kept it from it, and a baseline of another program, a line each."""
    if not policy.old:
        return
    notes = [*policy.other_programs(result)]
    if judge is None:
        from refcntd.analysis.baseline import against
        notes += against(result, policy.old, " and ".join(policy.names))
    else:
        notes += judge.notes
    for note in notes:
        print(f"refcntd: {note}", file=stream)


def finish_output(result: RunResult, args: argparse.Namespace, stream: TextIO) -> None:
    print(report.render_run(result), file=stream, end="", flush=True)
    if args.json:
        try:
            reportjson.write_json(result, args.json)
        except OSError as err:
            raise UsageError(f"cannot write {args.json}: {err.strerror}") from None
