"""`refcntd diff`: what was created since the checkpoint and is still live (from `serve`)."""

from __future__ import annotations

import argparse
import sys

from refcntd.cli import checkpoint
from refcntd.cli.checkpoint import call, serve_url

HELP = ("objects created since the checkpoint and still live, per process and allocation "
        "stack, from a running `serve` or `attach --listen`")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    checkpoint.listen_arguments(parser)
    parser.add_argument("--json", action="store_true", help="JSON instead of text")


def run(args: argparse.Namespace) -> int:
    query = "" if args.json else "?format=text"
    sys.stdout.write(call(f"{serve_url(args)}/diff{query}").decode(errors="replace"))
    return 0
