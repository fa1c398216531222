"""`refcntd checkpoint`: ask a running `serve` or `attach --listen` to mark the objects
live now."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request

from refcntd.errors import UsageError
from refcntd.inputs.config import load_config


def serve_url(args: argparse.Namespace) -> str:
    """The running daemon's address: --url, or the listen address of its config."""
    if args.url:
        return str(args.url).rstrip("/")
    config = load_config(args.config)
    return f"http://{config.listen_host}:{config.listen_port}"


def call(url: str, method: str = "GET") -> bytes:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method),
                                    timeout=60) as r:
            return bytes(r.read())
    except urllib.error.HTTPError as err:
        raise UsageError(f"{url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise UsageError(f"{url}: {reason}", "is `refcntd serve` or `refcntd attach --listen` "
                         "running there?") from None


def cmd_checkpoint(args: argparse.Namespace) -> int:
    answer = json.loads(call(f"{serve_url(args)}/checkpoint", "POST"))
    print(f"refcntd: checkpoint set at {answer['checkpoint']:.3f} (unix time)")
    return 0
