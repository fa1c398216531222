"""What the tracing commands share: the exit status, output files, printers."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypedDict

from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.binary.analysiscache import probe_count_hint
from refcntd.errors import EXIT_FINDINGS, EXIT_INCOMPLETE, UsageError
from refcntd.inputs.spec import Spec
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.outputs import report
from refcntd.session.tracer import TraceOptions, kernel_options

# CI formats, policies and saved runs are imported where used: `attach` must
# reach its probes fast (attach time is a benchmark goal).
if TYPE_CHECKING:
    from refcntd.outputs.policy import Verdict


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


def emit(text: str, path: str | None) -> None:
    if path is None:
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text)
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
        emit(json.dumps(ciformats.sarif(result, verdict, root), indent=2) + "\n", args.sarif)
    if args.junit:
        emit(ciformats.junit(result, verdict), args.junit)
    if annotate:
        print(ciformats.verdict_text(verdict), file=stream, end="")
        if os.environ.get("GITHUB_ACTIONS") == "true":
            ciformats.write_github(result, verdict, root, sys.stdout)


def warn_unlocated(result: RunResult, verdict: Verdict, root: Path) -> None:
    from refcntd.outputs import ciformats
    warning = ciformats.unlocated_warning(result, verdict, root)
    if warning:
        print(warning, file=sys.stderr)


class HistoryOptions(TypedDict):
    """The TraceOptions fields that --history and --history-depth set."""

    history: tuple[str, ...] | None
    history_depth: int


def history_options(args: argparse.Namespace) -> HistoryOptions:
    depth = args.history_depth  # its range is checked by argparse (cli/argtypes.py)
    if args.history is None:
        return {"history": None, "history_depth": depth}
    names = tuple(n.strip() for n in args.history.split(",") if n.strip())
    if not names:
        raise UsageError("--history: give 'all' or type names")
    return {"history": ("all",) if "all" in names else names, "history_depth": depth}


def early_compile(spec: Spec, filtered: bool, opts: TraceOptions, binary: str
                  ) -> BackgroundCompile:
    """Start compiling the BPF program before the analysis: it needs only the options and
    the number of probe slots, guessed from the spec or remembered from the last plan
    for this binary (a miss only costs the old time)."""
    guess = sum(max(1, len(r.functions)) * (2 if r.obj.at_return else 1)
                for r in spec.entries)
    count, hold = probe_count_hint(binary, spec)
    kopts = kernel_options(spec, True, filtered, opts)
    return BackgroundCompile(replace(kopts, hold=hold and kopts.unwind_offsets is not None),
                             max(guess, count))


def printer(stream: TextIO) -> Callable[[ProcessReport], None]:
    def show(p: ProcessReport) -> None:
        print(report.render_process(p), file=stream, flush=True)
    return show


def finish_output(result: RunResult, args: argparse.Namespace, stream: TextIO) -> None:
    print(report.render_run(result), file=stream, end="", flush=True)
    if args.json:
        try:
            report.write_json(result, args.json)
        except OSError as err:
            raise UsageError(f"cannot write {args.json}: {err.strerror}") from None
