"""prctl(2) for the command `run` starts: it must not outlive a SIGKILLed refcntd."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """In the forked child, before exec: SIGKILL when the forking thread dies.  If the
    parent is already gone (it died before this call), exit at once instead."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os.write(2, b"refcntd: prctl(PR_SET_PDEATHSIG) failed\n")
    if os.getppid() != parent:
        os._exit(137)
