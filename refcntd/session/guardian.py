"""A small process that continues what a dead refcntd left stopped.

The BPF side stops a process (SIGSTOP) the moment it maps a module refcntd must scan,
and records it in the kernel's `held` map; refcntd scans, then continues it. If refcntd
dies in between (SIGKILL, the OOM killer, a crash), the process would stay stopped
until the next refcntd starts, and a marker in /run/refcntd/held exists only once the
capture thread has seen the stop. So every tracer that can stop processes starts a
guardian: it inherits a descriptor of the `held` map (which keeps the map alive after
refcntd's death) and the read end of a pipe whose write end only refcntd holds. The
pipe reads end-of-file when refcntd is gone, however it went; the guardian then sends
SIGCONT to every process still in the map, and exits. On a normal detach the map is
already empty and the guardian just exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from refcntd.kernel import bpfsys

BPF_MAP_TYPE_HASH = 1


class Guardian:
    """Started with the tracer; `close()` on a normal detach, after the held map was
    emptied. Holding the write end of the pipe is the whole protocol."""

    def __init__(self, held_map_fd: int) -> None:
        read_end, self._write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "refcntd.session.guardian", str(read_end),
                 str(held_map_fd)], pass_fds=(read_end, held_map_fd), close_fds=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            os.close(read_end)

    def close(self) -> None:
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
            self.proc.wait()


def guard(read_end: int, held_map_fd: int) -> list[int]:
    """Wait for refcntd's end, then continue every process still held; the pids."""
    while os.read(read_end, 64):
        pass
    table = bpfsys.Table("held", held_map_fd, BPF_MAP_TYPE_HASH, ctypes.c_uint32,
                         ctypes.c_uint8 * bpfsys.map_info(held_map_fd).value_size, 0)
    continued = []
    for key in list(table.keys()):
        try:
            os.kill(key.value, signal.SIGCONT)
        except OSError:
            continue
        continued.append(key.value)
    return continued


def main(argv: list[str]) -> int:
    # Ctrl-C in refcntd's terminal reaches its whole process group: the guardian must
    # outlive refcntd, not die with it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    continued = guard(int(argv[0]), int(argv[1]))
    if continued:
        print(f"refcntd: continued {len(continued)} process(es) refcntd stopped and could "
              f"not continue itself: {' '.join(map(str, continued))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
