"""Command line: `refcntd COMMAND`, the commands listed in COMMANDS.

main() is the one exit point: it turns RefcntdError into one line on stderr
and its exit code.  Each command lives in its own module, with its arguments;
build_parser() assembles them.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Protocol

from refcntd import __version__, progress
from refcntd.cli import attach, check, checkpoint, diff, report, run, serve, spec
from refcntd.errors import RefcntdError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit, made one line
        raise UsageError(message, f"see `{self.prog} --help`")


class Command(Protocol):
    """What each command module provides (memray's Command protocol, as a module)."""

    HELP: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...
    def run(self, args: argparse.Namespace) -> int: ...


class _Prebuild:
    """`refcntd prebuild`, whose module (cli/prebuild.py) is being reworked elsewhere:
    its arguments stay here until it has its own add_arguments."""

    HELP = ("compile the BPF programs now (after installing, or a kernel or bcc upgrade), "
            "so that attach, run and serve start without waiting for clang")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--quiet", action="store_true", help="print nothing")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from refcntd.cli.prebuild import cmd_prebuild
        return cmd_prebuild(args)


# Every command, in the order --help lists them.  A command module imports its
# analysis and tracing stages inside run(): `attach` must reach its probes fast.
COMMANDS: dict[str, Command] = {
    "check": check, "attach": attach, "run": run, "report": report, "spec": spec,
    "checkpoint": checkpoint, "diff": diff, "prebuild": _Prebuild(), "serve": serve}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command with its arguments."""
    parser = _Parser(prog="refcntd", description="Reference-count leak tracer (uprobes + BPF)")
    parser.add_argument("--version", action="version", version=f"refcntd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if hasattr(args, "verbose"):
            progress.configure(args.verbose, args.quiet)
        return COMMANDS[args.command].run(args)
    except RefcntdError as err:
        # argv and file names may hold undecodable bytes (surrogates): shown escaped on
        # any stream, never a UnicodeEncodeError instead of the message
        print(err.line().encode("utf-8", "backslashreplace").decode(), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
