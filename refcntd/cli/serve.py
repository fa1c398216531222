"""`refcntd serve`: the daemon, with its metrics endpoint."""

from __future__ import annotations

import argparse
import glob
import ssl

from refcntd import __version__
from refcntd.errors import EXIT_INCOMPLETE, RefcntdError, UsageError
from refcntd.inputs.config import DEFAULT_CONFIG, Config, load_config
from refcntd.kernel import setup

HELP = "trace configured programs continuously; export Prometheus metrics and write reports"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help=f"YAML config (default {DEFAULT_CONFIG})")
    parser.add_argument("--strict", action="store_true",
                        help="exit if any target cannot be attached")
    parser.add_argument("--check", action="store_true",
                        help="only check the config file and exit")


def run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, ProcessCollector

    from refcntd.service import httpserver
    from refcntd.service.daemon import Daemon
    from refcntd.service.metrics import BuildInfo
    from refcntd.service.systemd import setup_logging
    config = load_config(args.config)
    if args.check:
        return _check(config, args.strict)
    setup.prepare()
    setup.require_host_pids()
    setup_logging()
    daemon = Daemon(config, strict=args.strict)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(daemon.collector())
    registry.register(daemon.gc_pauses)
    registry.register(BuildInfo(__version__, _bcc_version()))
    ready = httpserver.Readiness()
    try:
        httpserver.start(config.listen_host, config.listen_port, registry, ready, daemon.status,
                         daemon.views.routes(config.web.enable_checkpoint), config.web,
                         daemon.scrapes)
    except ssl.SSLError as err:
        raise UsageError(f"TLS of {config.web.config_file}: {err.reason or err}",
                         "check cert_file and key_file") from None
    except OSError as err:
        raise UsageError(f"cannot listen on {config.listen_host}:{config.listen_port}: "
                         f"{err.strerror}", f"change 'listen' in {config.path}") from None
    try:
        daemon.attach_all()
    except RefcntdError:
        daemon.shutdown()
        raise
    ready.set()
    daemon.run()
    return 0


def _check(config: Config, strict: bool) -> int:
    """The file is valid; with --strict also every target's binaries can be probed."""
    print(f"{config.path}: ok, {len(config.targets)} target(s), metrics on "
          f"{config.listen_host}:{config.listen_port}, reports in {config.report_dir}")
    if not strict:
        return 0
    from refcntd.binary.plan import build_plan
    failed = 0
    for target in config.targets:
        for path in sorted(glob.glob(target.path)) or [target.path]:
            try:
                build_plan(target.spec, path).require_complete()
                print(f"target {target.name}: {path}: every role can be probed")
            except RefcntdError as err:
                failed += 1
                print(f"target {target.name}: {path}: CANNOT ATTACH: {err.message}")
    return EXIT_INCOMPLETE if failed else 0


def _bcc_version() -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version("bcc")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
