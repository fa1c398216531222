"""`refcntd attach --binary B [--pid P]`: trace until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from refcntd.cli import argtypes
from refcntd.cli.options import output_arguments, progress_arguments, spec_arguments
from refcntd.errors import EXIT_INCOMPLETE, UsageError

if TYPE_CHECKING:
    from refcntd.session.tracer import Tracer

HELP = "trace a binary system-wide (or one pid) until Ctrl-C"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--binary", required=True, help="executable or shared library to probe")
    parser.add_argument("--pid", type=argtypes.PID, help="only this process and its descendants")
    parser.add_argument("--listen", type=argtypes.listen_address, metavar="HOST:PORT",
                        help="answer `refcntd checkpoint`/`diff` (POST /checkpoint, GET /diff, "
                             "GET /live) there while attached; SIGUSR1 sets a checkpoint and "
                             "SIGUSR2 prints the diff without it")
    spec_arguments(parser)
    output_arguments(parser)
    progress_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        raise UsageError(f"no process {args.pid}", "attach --pid needs a running process")
    from refcntd.cli.early import early_compile, history_options
    from refcntd.inputs.spec import load_spec
    from refcntd.kernel import setup
    from refcntd.session.options import TraceOptions
    opts = TraceOptions(max_objects=args.max_objects, max_stacks=args.max_stacks,
                        sites=True, **history_options(args))  # checkpoints and diffs
    spec = load_spec(args.spec)
    args.binary = os.path.abspath(args.binary)  # before bcc's compile changes cwd a moment
    setup.prepare()  # before the early compile: it needs the kernel headers
    early = early_compile(spec, args.pid is not None, opts, args.binary)
    # the analysis and tracing modules load while the compile runs
    from refcntd.binary.sitemode import parse_modes
    from refcntd.cli.common import finish_output, printer
    from refcntd.cli.stages import analyse
    from refcntd.session.attach import attach
    plan = analyse(spec, args.binary, parse_modes(args.probe_mode))
    plan.require_complete()
    ready = lambda: print(f"refcntd: attached to {args.binary}; Ctrl-C to detach",  # noqa: E731
                          file=sys.stderr, flush=True)
    result = attach(plan, args.pid, opts, printer(sys.stdout), ready, early,
                    lambda tracer: _views(tracer, args))
    finish_output(result, args, sys.stdout)
    return 0 if result.tracing.complete else EXIT_INCOMPLETE


def _views(tracer: Tracer, args: argparse.Namespace) -> Callable[[], None]:
    """Checkpoints and diffs of a long attach: SIGUSR1 marks, SIGUSR2 prints the diff,
    and with --listen the same HTTP routes as serve.  Signals only set flags: the
    work is done between polls."""
    from prometheus_client import CollectorRegistry

    from refcntd.service import httpserver
    from refcntd.service.checkpoint import Views
    views = Views(lambda: {os.path.basename(args.binary): [tracer]}, threading.RLock())
    asked: set[int] = set()
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: asked.add(s))
    if args.listen is not None:
        host, port = args.listen
        ready = httpserver.Readiness()
        ready.set()
        try:
            httpserver.start(host, port, CollectorRegistry(), ready, routes=views.routes())
        except OSError as err:
            raise UsageError(f"cannot listen on {host}:{port}: {err.strerror}",
                             "choose another --listen address") from None
        print(f"refcntd: checkpoints and diffs on http://{host}:{port} (refcntd checkpoint "
              f"--url http://{host}:{port})", file=sys.stderr, flush=True)

    def tick() -> None:
        if signal.SIGUSR1 in asked:
            asked.discard(signal.SIGUSR1)
            cp = views.mark()
            print(f"refcntd: checkpoint set at {cp.wall:.3f}", file=sys.stderr, flush=True)
        if signal.SIGUSR2 in asked:
            asked.discard(signal.SIGUSR2)
            sys.stdout.write(views.text(True))
            sys.stdout.flush()
    return tick
