"""What a process's open fds are (/proc/PID/fd), by kind: the count by kind is how a
leaked fd is named (detach must close every bpf_link and perf event it opened; the
soak's hour once kept 12 fds more after an upgrade and could not say which)."""

from __future__ import annotations

import os
import re
from collections import Counter

_INODE = re.compile(r":\[\d+\]$")


def fd_kinds(pid: int | str = "self") -> dict[str, int]:
    """Open fds by what they are: `anon_inode:bpf-map`, `anon_inode:[perf_event]`,
    `socket`, `pipe` (without their inode), a file by its directory."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        kinds[os.path.dirname(target) if target.startswith("/") else
              _INODE.sub("", target)] += 1
    return dict(kinds)
