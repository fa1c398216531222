"""`refcntd serve`: the daemon, with its metrics endpoint."""

from __future__ import annotations

import argparse

from refcntd.errors import RefcntdError, UsageError
from refcntd.inputs.config import load_config
from refcntd.kernel import setup


def cmd_serve(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry, ProcessCollector

    from refcntd.service import httpserver
    from refcntd.service.daemon import Daemon, setup_logging
    config = load_config(args.config)
    if args.check:
        print(f"{config.path}: ok, {len(config.targets)} target(s), metrics on "
              f"{config.listen_host}:{config.listen_port}, reports in {config.report_dir}")
        return 0
    setup.prepare()
    setup_logging()
    daemon = Daemon(config, strict=args.strict)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(daemon.collector())
    try:
        httpserver.start(config.listen_host, config.listen_port, registry)
    except OSError as err:
        raise UsageError(f"cannot listen on {config.listen_host}:{config.listen_port}: "
                         f"{err.strerror}", f"change 'listen' in {config.path}") from None
    try:
        daemon.attach_all()
    except RefcntdError:
        daemon.shutdown()
        raise
    daemon.run()
    return 0
