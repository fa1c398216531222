"""The start of attach and run: the BPF compile begins here, before the binary
analysis and before the imports the analysis and tracing need (attach time is a
benchmark goal: about 0.2 s of imports now overlap the compile)."""

from __future__ import annotations

import argparse
from typing import TypedDict

from refcntd.binary.hints import probe_count_hint
from refcntd.errors import UsageError
from refcntd.inputs.spec import Spec
from refcntd.kernel.precompile import BackgroundCompile
from refcntd.session.options import TraceOptions, kernel_options
from refcntd.session.vetting import with_holds

NO_HINT_SLOTS = 32768  # probe slots of an early compile for a file never planned before


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
    if not count:  # a file never planned: room for a call-site plan (a 3 MiB array)
        count = NO_HINT_SLOTS
    kopts = kernel_options(spec, True, filtered, opts)
    kopts = with_holds(kopts, hold, opts.scan_execs and filtered)
    return BackgroundCompile(kopts, max(guess, count))
