"""The one validator for numeric options: range (and shape) checked by argparse.

Why here: a value outside what the kernel side accepts (a map of 0 entries,
an exit status of 256 that wraps to 0) must be a usage error before any
analysis or BPF compile, never raw compiler output or a silently wrong exit.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parser is built before any command runs: kept light
    from refcntd.session.options import Credentials


@dataclass(frozen=True)
class Ranged:
    """An argparse `type=`: an int (or float) in [low, high], optionally a power of two."""

    low: float
    high: float
    real: bool = False  # float instead of int
    power_of_two: bool = False

    @property
    def __name__(self) -> str:  # argparse names the type in "invalid ... value"
        return "number" if self.real else "integer"

    def describe(self) -> str:
        shape = "a power of two" if self.power_of_two else ("a number" if self.real
                                                              else "an integer")
        return f"{shape} in {_show(self.low)}..{_show(self.high)}"

    def __call__(self, text: str) -> int | float:
        try:
            value: int | float = float(text) if self.real else int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {self.describe()}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {self.describe()}")
        bad_shape = self.power_of_two and int(value) & (int(value) - 1)
        if not self.low <= value <= self.high or bad_shape:
            raise argparse.ArgumentTypeError(f"{text}: must be {self.describe()}")
        return value


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


# The allowed ranges, documented in docs/commands/README.md's option table.
PID = Ranged(1, 4194304)                       # the kernel's PID_MAX_LIMIT
EXIT_STATUS = Ranged(0, 255)                   # what exit() can carry without wrapping
MAX_OBJECTS = Ranged(1, 1 << 22)               # BPF hash map entries (buckets are allocated)
MAX_STACKS = Ranged(1, 1 << 18)
HISTORY_DEPTH = Ranged(4, 256, power_of_two=True)
WAIT_SECONDS = Ranged(0, 86400, real=True)


def output_path(text: str) -> str:
    """An argparse `type=` for files refcntd writes: checked at parse time, so that a typo
    in a path fails in a second instead of after CMD ran for an hour.  `-` is standard
    output."""
    if text == "-":
        return text
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: is a directory, not a file to write")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} does not exist")
    if path.exists():  # a regular file must be writable; /dev/stdout, a FIFO: as given
        if path.is_file() and not os.access(path, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text}: not writable")
        return text
    try:  # access() says yes to root on /proc or a read-only mount: really create it
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        path.unlink()
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text}: cannot create ({err.strerror})") from None
    return text


def listen_address(text: str) -> tuple[str, int]:
    """--listen HOST:PORT."""
    from refcntd.inputs.config import split_listen
    address = split_listen(text)
    if address is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:10272")
    return address


def credentials(text: str) -> Credentials:
    """--user USER[:GROUP], names or numbers, as `sudo -u`/`strace -u` take them: the
    user's primary group and supplementary groups unless GROUP is given."""
    import grp
    import pwd

    from refcntd.session.options import Credentials
    name, _, group = text.partition(":")
    try:
        entry = pwd.getpwnam(name) if not name.isdigit() else pwd.getpwuid(int(name))
    except KeyError:
        raise argparse.ArgumentTypeError(f"no user {name!r}") from None
    gid = entry.pw_gid
    groups = tuple(os.getgrouplist(entry.pw_name, gid))
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid if not group.isdigit() else int(group)
        except KeyError:
            raise argparse.ArgumentTypeError(f"no group {group!r}") from None
        groups = (gid,)
    return Credentials(entry.pw_name, entry.pw_uid, gid, groups)
