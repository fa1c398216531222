"""`refcntd spec draft`: propose a spec for a library, for the user to confirm."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from refcntd.cli import argtypes
from refcntd.cli.common import emit
from refcntd.errors import UsageError

HELP = "help writing a spec: `spec draft --library PATH`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="spec_command", required=True, parser_class=type(parser))
    draft = sub.add_parser("draft", help="propose a spec from a library's exported "
                                         "symbols and SDT notes (a draft to confirm)")
    draft.add_argument("--library", required=True,
                       help="the shared library to read: a path, or a soname "
                            "(libjson-glib-1.0.so.0) found as ld.so would")
    draft.add_argument("--name", help="the spec's name (default: LIBRARY-draft)")
    draft.add_argument("--output", metavar="FILE", type=argtypes.output_path,
                       help="write there instead of stdout")


def run(args: argparse.Namespace) -> int:
    from refcntd.binary.specdraft import propose, render
    path = args.library
    if not Path(path).exists() and "/" not in path:  # a soname, found as ld.so would
        from refcntd.binary.libpaths import resolve_library
        from refcntd.errors import BinaryError
        try:
            path = resolve_library(path, None)
        except BinaryError:
            raise UsageError(f"no file {args.library}, and no library of that name in "
                             "the linker's directories") from None
    if not Path(path).exists():
        raise UsageError(f"no file {args.library}")
    draft = propose(path)
    if not draft.types and not draft.usdt:
        raise UsageError(f"no refcount API found in {args.library}",
                         "write the spec by hand (see docs/specs.md)")
    name = args.name or re.sub(r"\.so.*$", "", Path(args.library).name) + "-draft"
    text = render(draft, name)
    if args.output:
        emit(text, args.output)
    else:
        print(text, end="")
    return 0
