"""What `serve` tells systemd: readiness and stopping (sd_notify, for Type=notify),
and one line per event on stderr, with a <N> priority prefix under journald."""

from __future__ import annotations

import contextlib
import logging
import os
import socket

log = logging.getLogger("refcntd")


class JournalFormatter(logging.Formatter):
    """One event per line; under journald a <N> syslog priority prefix sets the level."""

    PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname} {record.getMessage()}".replace("\n", " ")
        if os.environ.get("JOURNAL_STREAM"):
            return f"<{self.PRIORITY.get(record.levelname, 6)}>{line}"
        return line


def setup_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JournalFormatter())
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def sd_notify(state: str) -> None:
    """Tell systemd (Type=notify) that probes are attached; no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(state.encode(), address)
