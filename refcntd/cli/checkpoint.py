"""`refcntd checkpoint`: ask a running `serve` or `attach --listen` to mark the objects
live now."""

from __future__ import annotations

import argparse
import json

from refcntd.errors import UsageError
from refcntd.inputs.config import DEFAULT_CONFIG, load_config

HELP = "mark the objects live now in a running `serve` or `attach --listen`"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the running daemon listens; --scan (GET /leaks) instead of a mark."""
    listen_arguments(parser)
    parser.add_argument("--scan", action="store_true",
                        help="instead: stop each traced process briefly, scan its memory and "
                             "print the objects definitely or indirectly lost now (GET /leaks)")
    parser.add_argument("--budget-ms", type=float, default=1000.0, metavar="MS",
                        help="with --scan: the longest stop; a process whose scan would take "
                             "longer is not stopped (default 1000)")
    parser.add_argument("--copy-mib", type=float, default=4096.0, metavar="MIB",
                        help="with --scan: the most memory copied per process so that it is "
                             "continued before its scan; over it, or 0, it stays stopped "
                             "while scanned (default 4096, and at most half of MemAvailable)")


def listen_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the running daemon listens (diff takes these too)."""
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help=f"serve's config, for its listen address (default {DEFAULT_CONFIG})")
    parser.add_argument("--url", help="serve's address instead, e.g. http://127.0.0.1:10271, "
                                      "or attach's --listen address")


def serve_url(args: argparse.Namespace) -> str:
    """The running daemon's address: --url, or the listen address of its config."""
    if args.url:
        return str(args.url).rstrip("/")
    config = load_config(args.config)
    return f"http://{config.listen_host}:{config.listen_port}"


def call(url: str, method: str = "GET") -> bytes:
    import urllib.error
    import urllib.request
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


def run(args: argparse.Namespace) -> int:
    if args.scan:
        return _scan(args)
    answer = json.loads(call(f"{serve_url(args)}/checkpoint", "POST"))
    print(f"refcntd: checkpoint set at {answer['checkpoint']:.3f} (unix time)")
    return 0


def _scan(args: argparse.Namespace) -> int:
    """GET /leaks, printed as the text report of each target's lost objects."""
    from refcntd.outputs.report import render_process
    from refcntd.outputs.runjson import run_from_json
    answer = json.loads(call(f"{serve_url(args)}/leaks?budget_ms={args.budget_ms:g}"
                             f"&copy_mib={args.copy_mib:g}"))
    lost = 0
    for name, target in sorted(answer["targets"].items()):
        for scan in target["scans"]:
            print(f"refcntd: target {name}: process {scan['pid']}: " + (
                scan["skipped"] or f"stopped {scan['stopped_s'] * 1000:.1f} ms"))
        for process in run_from_json(target["run"]).processes:
            lost += process.leaked_objects
            print(render_process(process))
    print(f"refcntd: {lost} object(s) definitely or indirectly lost now")
    return 0
