"""`refcntd attach --binary B [--pid P]`: trace until Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from refcntd.cli import argtypes
from refcntd.cli.options import output_arguments, progress_arguments, spec_arguments
from refcntd.errors import EXIT_INCOMPLETE, UsageError

if TYPE_CHECKING:
    from refcntd.inputs.webconfig import WebOptions
    from refcntd.session.tracer import Tracer

HELP = "trace a binary system-wide (or one pid) until Ctrl-C"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--binary", required=True, help="executable or shared library to probe")
    parser.add_argument("--pid", type=argtypes.PID, help="only this process and its descendants")
    parser.add_argument("--listen", type=argtypes.listen_address, metavar="HOST:PORT",
                        help="answer `refcntd checkpoint`/`diff` (POST /checkpoint, GET /diff, "
                             "GET /live) there while attached; SIGUSR1 sets a checkpoint and "
                             "SIGUSR2 prints the diff without it")
    parser.add_argument("--web-enable-checkpoint", action="store_true",
                        help="with --listen: accept POST /checkpoint (off: any local user "
                             "could change state; SIGUSR1 always works)")
    parser.add_argument("--web-show-cmdline", action="store_true",
                        help="with --listen: show traced processes' command lines in /live, "
                             "/diff")
    parser.add_argument("--web-config-file", metavar="FILE",
                        help="with --listen: TLS and basic auth from an exporter-toolkit web "
                             "configuration file")
    spec_arguments(parser)
    output_arguments(parser)
    progress_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        raise UsageError(f"no process {args.pid}", "attach --pid needs a running process")
    from refcntd.cli.early import early_compile, history_options
    from refcntd.inputs.spec import load_specs
    from refcntd.kernel import setup
    from refcntd.session.options import TraceOptions
    opts = TraceOptions(max_objects=args.max_objects, max_stacks=args.max_stacks,
                        sites=True, **history_options(args))  # checkpoints and diffs
    spec = load_specs(args.spec)
    args.web = _web_options(args)  # a bad web configuration file fails before any probe
    args.binary = os.path.abspath(args.binary)  # before bcc's compile changes cwd a moment
    setup.prepare()  # before the early compile: it needs the kernel headers
    setup.require_host_pids()
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
    from refcntd.analysis.model import STATE_LIVE_AT_DETACH
    live = sum(1 for p in result.processes if p.state == STATE_LIVE_AT_DETACH)
    print(f"refcntd: detached from {args.binary}: {len(result.processes)} process(es) "
          f"reported, {live} of them still running (their objects: live at detach)",
          file=sys.stderr, flush=True)
    finish_output(result, args, sys.stdout)
    return 0 if result.tracing.complete else EXIT_INCOMPLETE


def _web_options(args: argparse.Namespace) -> WebOptions:
    from refcntd.inputs.webconfig import WebOptions, with_web_config
    web = WebOptions(enable_checkpoint=args.web_enable_checkpoint,
                     show_cmdline=args.web_show_cmdline)
    return with_web_config(web, args.web_config_file) if args.web_config_file else web


def _views(tracer: Tracer, args: argparse.Namespace) -> Callable[[], None]:
    """Checkpoints and diffs of a long attach: SIGUSR1 marks, SIGUSR2 prints the diff,
    and with --listen the same HTTP routes as serve.  Signals only set flags: the
    work is done between polls."""
    from prometheus_client import CollectorRegistry

    from refcntd.service import httpserver
    from refcntd.service.checkpoint import Views
    web = args.web
    views = Views(lambda: {os.path.basename(args.binary): [tracer]}, threading.RLock(),
                  web.show_cmdline)
    asked: set[int] = set()
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: asked.add(s))
    if args.listen is not None:
        host, port = args.listen
        ready = httpserver.Readiness()
        ready.set()
        try:
            httpserver.start(host, port, CollectorRegistry(), ready,
                             routes=views.routes(web.enable_checkpoint), web=web)
        except ssl.SSLError as err:
            raise UsageError(f"TLS of {web.config_file}: {err.reason or err}",
                             "check cert_file and key_file") from None
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
