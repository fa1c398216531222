"""`refcntd spec draft`: propose a spec for a library, for the user to confirm."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from refcntd.binary.specdraft import propose, render
from refcntd.cli.common import emit
from refcntd.errors import UsageError


def cmd_spec(args: argparse.Namespace) -> int:
    if not Path(args.library).exists():
        raise UsageError(f"no file {args.library}")
    draft = propose(args.library)
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
