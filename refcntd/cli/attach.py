"""`refcntd attach --binary B [--pid P]`: trace until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from refcntd.cli.early import early_compile, history_options
from refcntd.errors import EXIT_INCOMPLETE, UsageError
from refcntd.inputs.spec import load_spec
from refcntd.kernel import setup
from refcntd.session.options import TraceOptions


def cmd_attach(args: argparse.Namespace) -> int:
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        raise UsageError(f"no process {args.pid}", "attach --pid needs a running process")
    opts = TraceOptions(max_objects=args.max_objects, max_stacks=args.max_stacks,
                        **history_options(args))
    spec = load_spec(args.spec)
    args.binary = os.path.abspath(args.binary)  # before bcc's compile changes cwd a moment
    setup.prepare()  # before the early compile: it needs the kernel headers
    early = early_compile(spec, args.pid is not None, opts, args.binary)
    # the analysis and tracing modules load while the compile runs
    from refcntd.binary.sitemode import parse_modes
    from refcntd.cli.common import finish_output, printer
    from refcntd.cli.stages import analyse
    from refcntd.session.tracer import attach
    plan = analyse(spec, args.binary, parse_modes(args.probe_mode))
    plan.require_complete()
    ready = lambda: print(f"refcntd: attached to {args.binary}; Ctrl-C to detach",  # noqa: E731
                          file=sys.stderr, flush=True)
    result = attach(plan, args.pid, opts, printer(sys.stdout), ready, early)
    finish_output(result, args, sys.stdout)
    return 0 if result.tracing.complete else EXIT_INCOMPLETE
