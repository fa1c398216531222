"""fd_kinds names each open fd of a process by its kind (the soak's fd sampler and
held_fds, which detach tests check, both read it)."""

from __future__ import annotations

import os
import socket

from refcntd.kernel.procfds import fd_kinds


def test_each_fd_is_counted_under_its_kind(tmp_path):
    before = fd_kinds()
    read, write = os.pipe()
    sock = socket.socket()
    files = [open(tmp_path / f"f{i}", "w") for i in range(3)]  # noqa: SIM115 - closed below
    try:
        after = fd_kinds(os.getpid())
    finally:
        for f in files:
            f.close()
        sock.close()
        os.close(read)
        os.close(write)
    grown = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert grown == {"pipe": 2, "socket": 1, str(tmp_path): 3}

