"""Command line: `refcntd check | attach | run | report | spec | serve | prebuild`.

main() is the one exit point: it turns RefcntdError into one line on stderr
and its exit code.  Each command lives in its own module.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from refcntd import __version__, progress
from refcntd.cli import argtypes
from refcntd.errors import EXIT_FINDINGS, RefcntdError, UsageError
from refcntd.inputs.config import DEFAULT_CONFIG
from refcntd.outputs.formats import RENDERERS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit, made one line
        raise UsageError(message, f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refcntd", description="Reference-count leak tracer (uprobes + BPF)")
    parser.add_argument("--version", action="version", version=f"refcntd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = sub.add_parser("check", help="show what would be probed and how, without tracing")
    check.add_argument("--binary", required=True, help="executable or shared library")
    check.add_argument("--pid", type=argtypes.PID,
                       help="also show the USDT semaphore values of this live process")
    _spec_arg(check)
    _progress_args(check)

    att = sub.add_parser("attach", help="trace a binary system-wide (or one pid) until Ctrl-C")
    att.add_argument("--binary", required=True, help="executable or shared library to probe")
    att.add_argument("--pid", type=argtypes.PID, help="only this process and its descendants")
    att.add_argument("--listen", type=argtypes.listen_address, metavar="HOST:PORT",
                     help="answer `refcntd checkpoint`/`diff` (POST /checkpoint, GET /diff, "
                          "GET /live) there while attached; SIGUSR1 sets a checkpoint and "
                          "SIGUSR2 prints the diff without it")
    _spec_arg(att)
    _output_args(att)
    _progress_args(att)

    run = sub.add_parser("run", help="run a command under the tracer; exit status says if "
                                     "it leaked")
    _spec_arg(run)
    _output_args(run)
    _progress_args(run)
    run.add_argument("--wait-descendants", type=argtypes.WAIT_SECONDS, default=10.0,
                     metavar="SECONDS",
                     help="after the command exits, wait this long for its traced "
                          "descendants (default 10)")
    _ci_args(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    rep = sub.add_parser("report", help="render a saved run (--json) again")
    rep.add_argument("run_json", metavar="RUN.json")
    rep.add_argument("--format", choices=tuple(RENDERERS),
                     default="text", help="folded: stacks for flame graphs")
    rep.add_argument("--output", metavar="FILE", type=argtypes.output_path,
                     help="write there instead of stdout")
    _ci_args(rep)

    spec = sub.add_parser("spec", help="help writing a spec: `spec draft --library PATH`")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True, parser_class=_Parser)
    draft = spec_sub.add_parser("draft", help="propose a spec from a library's exported "
                                              "symbols and SDT notes (a draft to confirm)")
    draft.add_argument("--library", required=True, help="the shared library to read")
    draft.add_argument("--name", help="the spec's name (default: LIBRARY-draft)")
    draft.add_argument("--output", metavar="FILE", type=argtypes.output_path,
                       help="write there instead of stdout")

    for name, what in (("checkpoint", "mark the objects live now in a running `serve` or "
                                      "`attach --listen`"),
                       ("diff", "objects created since the checkpoint and still live, per "
                                "process and allocation stack, from a running `serve` or "
                                "`attach --listen`")):
        cmd = sub.add_parser(name, help=what)
        cmd.add_argument("--config", default=str(DEFAULT_CONFIG),
                         help="serve's config, for its listen address "
                              f"(default {DEFAULT_CONFIG})")
        cmd.add_argument("--url", help="serve's address instead, e.g. http://127.0.0.1:10271, "
                                       "or attach's --listen address")
        if name == "diff":
            cmd.add_argument("--json", action="store_true", help="JSON instead of text")

    pre = sub.add_parser("prebuild", help="compile the BPF programs now (after installing, "
                                          "or a kernel or bcc upgrade), so that attach, run "
                                          "and serve start without waiting for clang")
    pre.add_argument("--quiet", action="store_true", help="print nothing")

    serve = sub.add_parser("serve", help="trace configured programs continuously; export "
                                         "Prometheus metrics and write reports")
    serve.add_argument("--config", default=str(DEFAULT_CONFIG),
                       help=f"YAML config (default {DEFAULT_CONFIG})")
    serve.add_argument("--strict", action="store_true",
                       help="exit if any target cannot be attached")
    serve.add_argument("--check", action="store_true",
                       help="only check the config file and exit")
    return parser


def _spec_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default="perf-stubs",
                   help="bundled spec name or YAML file (default: perf-stubs)")
    p.add_argument("--probe-mode", metavar="MODE",
                   default=os.environ.get("REFCNTD_PROBE_MODE", "auto"),
                   help="where function probes go: auto (default: call sites when the entry "
                        "would be single-stepped and every call is found), entry, callsites; "
                        "or per role, e.g. get=callsites,put=entry (default: "
                        "$REFCNTD_PROBE_MODE, else auto)")


def _progress_args(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--verbose", action="store_true",
                       help="print on stderr where the time goes (analysis, BPF compile, "
                            "probe creation, per-process setup)")
    group.add_argument("--quiet", action="store_true",
                       help="no progress on stderr for long steps")


def _ci_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sarif", metavar="FILE", type=argtypes.output_path,
                   help="also write SARIF 2.1.0")
    p.add_argument("--junit", metavar="FILE", type=argtypes.output_path,
                   help="also write JUnit XML")
    p.add_argument("--suppressions", metavar="FILE",
                   help="rules (leak:, type:, anomaly:) for findings that must not fail")
    p.add_argument("--baseline", metavar="OLD.json",
                   help="fail only on findings absent from this earlier run")
    p.add_argument("--max-leaks", action="append", default=[], metavar="TYPE=N",
                   help="fail only above N leaked objects of TYPE (* for any type)")
    p.add_argument("--exitcode", type=argtypes.EXIT_STATUS, default=EXIT_FINDINGS, metavar="N",
                   help=f"exit status when findings fail the run, 0..255 (default {EXIT_FINDINGS})")
    p.add_argument("--strict", action="store_true",
                   help="exit 24 unless the report is exact and readable: also for "
                        "unresolved or truncated stacks, unreadable type names, exits not seen")
    p.add_argument("--source-root", default=".", metavar="DIR",
                   help="the user's source tree: SARIF and annotations point into it "
                        "(default: the current directory)")


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", type=argtypes.output_path,
                   help="also write the report as JSON")
    p.add_argument("--history", nargs="?", const="all", metavar="TYPES",
                   help="keep each object's get/put stacks and name the likely culprit of "
                        "each leak: 'all' (the default when given) or a comma-separated "
                        "list of type names; costs a stack walk per get/put")
    p.add_argument("--history-depth", type=argtypes.HISTORY_DEPTH, default=16, metavar="N",
                   help="operations kept per object, oldest first (power of two, "
                        "4..256; default 16); the rest are counted as dropped")
    p.add_argument("--max-objects", type=argtypes.MAX_OBJECTS, default=1 << 20,
                   help="object map capacity, 1..4194304 (default 1048576)")
    p.add_argument("--max-stacks", type=argtypes.MAX_STACKS, default=8192,
                   help="stack store capacity, 1..262144 (default 8192 distinct stacks)")


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if hasattr(args, "verbose"):
            progress.configure(args.verbose, args.quiet)
        return _command(args.command)(args)
    except RefcntdError as err:
        # argv and file names may hold undecodable bytes (surrogates): shown escaped on
        # any stream, never a UnicodeEncodeError instead of the message
        print(err.line().encode("utf-8", "backslashreplace").decode(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """Import only the command asked for: `attach` must reach its probes fast."""
    module = importlib.import_module(f"refcntd.cli.{name}")
    return getattr(module, f"cmd_{name}")  # type: ignore[no-any-return]


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
