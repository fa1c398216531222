"""`refcntd diff`: what was created since the checkpoint and is still live (from `serve`)."""

from __future__ import annotations

import argparse
import sys

from refcntd.cli.checkpoint import call, serve_url


def cmd_diff(args: argparse.Namespace) -> int:
    query = "" if args.json else "?format=text"
    sys.stdout.write(call(f"{serve_url(args)}/diff{query}").decode(errors="replace"))
    return 0
