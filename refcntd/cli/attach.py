"""`refcntd attach --binary B [--pid P]`: trace until Ctrl-C."""

from __future__ import annotations

import argparse
import sys

from refcntd.binary.plan import build_plan
from refcntd.cli.common import finish_output, history_options, printer
from refcntd.errors import EXIT_INCOMPLETE
from refcntd.inputs.spec import load_spec
from refcntd.kernel import setup
from refcntd.session.tracer import TraceOptions, attach


def cmd_attach(args: argparse.Namespace) -> int:
    opts = TraceOptions(max_objects=args.max_objects, max_stacks=args.max_stacks,
                        **history_options(args))
    plan = build_plan(load_spec(args.spec), args.binary)
    plan.require_complete()
    setup.prepare()
    ready = lambda: print(f"refcntd: attached to {args.binary}; Ctrl-C to detach",  # noqa: E731
                          file=sys.stderr, flush=True)
    result = attach(plan, args.pid, opts, printer(sys.stdout), ready)
    finish_output(result, args, sys.stdout)
    return 0 if result.tracing.complete else EXIT_INCOMPLETE
