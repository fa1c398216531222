"""exec events from the netlink proc connector: prompt discovery of new binaries.

Only a hint: exits are taken from the ordered BPF stream (session/lifecycle.py:
the ring buffer delivers a process's exit after all its own events).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import struct
import time

log = logging.getLogger("refcntd")
PROC_EVENT_EXEC = 0x2
_NLMSG_HDR, _CN_MSG_HDR, _PROC_EVENT_HDR = 16, 20, 16  # then the event's own fields
RECV_SIZE = 65536  # bytes read per datagram


def exec_tgids(data: bytes) -> list[int]:
    """tgids of PROC_EVENT_EXEC messages in one datagram (linux/cn_proc.h layout).

    Decoded here because pyroute2 0.9's ProcEventSocket.get() drops all but
    the first event when several are pending.
    """
    out, offset = [], 0
    while offset + _NLMSG_HDR + _CN_MSG_HDR + _PROC_EVENT_HDR + 8 <= len(data):
        length = struct.unpack_from("<I", data, offset)[0]
        event = offset + _NLMSG_HDR + _CN_MSG_HDR
        if struct.unpack_from("<I", data, event)[0] == PROC_EVENT_EXEC:
            out.append(struct.unpack_from("<I", data, event + _PROC_EVENT_HDR + 4)[0])
        if length < _NLMSG_HDR:
            break
        offset += (length + 3) & ~3
    return out


class ProcConnector:
    """The connector's socket, or nothing (then execs() only waits)."""

    def __init__(self) -> None:
        self.sock = None
        try:
            from pyroute2 import ProcEventSocket
            self.sock = ProcEventSocket()
            self.sock.bind()
            self.sock.control(listen=True)
        except Exception as err:  # noqa: BLE001 - optional: globs are then matched at load only
            log.warning("proc connector unavailable (%s): new binaries matching a glob are "
                        "attached only on reload", err)
            self.sock = None

    def execs(self, timeout: float) -> list[tuple[int, str]]:
        """(tgid, executable) of programs exec'd since the last call."""
        if self.sock is None:
            time.sleep(timeout)
            return []
        ready, _, _ = select.select([self.sock], [], [], timeout)
        out = []
        while ready:
            try:
                data = self.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # ENOBUFS: events were lost; globs catch up on reload
                log.warning("proc connector: %s", err.strerror)
                break
            for tgid in exec_tgids(data):
                with contextlib.suppress(OSError):
                    out.append((tgid, os.readlink(f"/proc/{tgid}/exe")))
        return out

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
