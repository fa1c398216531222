"""Where an output the user named goes: a regular file is replaced, anything else is
written in place.

Every report, profile and spec refcntd writes goes through `output_file`.  A
regular file (or a new one) is written as a temporary file renamed over the
target (safefs.atomic_file): a link the traced command planted there is
replaced, never followed.  That is wrong for everything else a user names on
a command line: `--json /dev/null` must not replace the host's /dev/null with
a file, `--output /dev/stdout` must not replace the link in /dev, `--json
>(jq .)` must reach jq.  So:

* `-` is standard output;
* /dev/stdout, /dev/fd/N, /proc/self/fd/N (whatever links lead there) are
  refcntd's own descriptor N, written through a duplicate of it: the shell's
  offset and O_APPEND are kept, nothing is reopened or truncated;
* a character or block device or a FIFO is opened for writing, never
  truncated, never replaced; a socket is connected to;
* a symbolic link is followed only where the kernel's fs.protected_symlinks
  rule would let root follow it: not in a sticky world-writable directory
  (/tmp) unless the link's owner owns that directory or is refcntd's euid.
  A last component that fails the rule is replaced as a planted link; a
  directory on the way that fails it is refused.  A FIFO or socket in such a
  directory owned by neither is treated the same way (fs.protected_fifos):
  replaced, so that another user neither reads the report nor blocks it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from refcntd.inputs.safefs import atomic_file

STDOUT = "-"
_MAX_LINKS = 40  # the kernel's MAXSYMLINKS


@dataclass(frozen=True)
class Destination:
    """What writing to a path means: `fd` (a descriptor of ours), `special` (a device, FIFO
    or socket at `path`) or `file` (a regular file at `path`, replaced)."""

    kind: str
    path: str = ""
    fd: int = -1
    mode: int = 0


def destination(name: str) -> Destination:
    """Resolve `name` one component at a time, applying the link rule to every link met."""
    if name == STDOUT:
        return Destination("fd", fd=1)
    parts = os.path.abspath(name).split("/")[1:]
    current, links = "/", 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":  # `current` is already physical: its parent is the real one
            current = os.path.dirname(current)
            continue
        fd = _own_fd(current, part)
        if fd is not None and not parts:
            return Destination("fd", fd=fd)
        step = os.path.join(current, part)
        info = _lstat(step)
        if info is None:  # missing: a new file there (or a directory error on open)
            return Destination("file", os.path.join(step, *parts))
        if not stat.S_ISLNK(info.st_mode):
            current = step
            continue
        if not _may_follow(current, info):
            if parts:
                raise OSError(errno.EACCES, f"{step}: a link in a sticky world-writable "
                              "directory, owned by another user: not followed")
            return Destination("file", step)  # a planted link: replaced, as a file
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        target = os.readlink(step)
        current = "/" if target.startswith("/") else current
        parts = [*target.split("/"), *parts]
    return _at(current)


def _at(path: str) -> Destination:
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        return Destination("file", path)
    if stat.S_ISDIR(info.st_mode):
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
    planted = stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode)
    if planted and not _may_follow(os.path.dirname(path), info):
        return Destination("file", path)
    return Destination("special", path, mode=info.st_mode)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _own_fd(directory: str, part: str) -> int | None:
    """N when `directory`/`part` is /proc/<our pid>[/task/<tid>]/fd/N (what /proc/self,
    /proc/thread-self and /dev/fd lead to): that link names no path to reopen."""
    if not part.isdigit():
        return None
    pid = os.getpid()
    if re.fullmatch(rf"/proc/{pid}(/task/\d+)?/fd", directory):
        return int(part)
    return None


def _may_follow(directory: str, info: os.stat_result) -> bool:
    """fs.protected_symlinks (and _fifos) as the kernel applies them to root: an entry in a
    sticky world-writable directory counts only if its owner owns the directory or is us."""
    parent = os.stat(directory)
    shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    return not shared or info.st_uid in (parent.st_uid, os.geteuid())


@contextlib.contextmanager
def output_file(name: str, mode: int = 0o644, append: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write the output `name` through (see the module docstring).

    `append` adds to a regular file (read whole, rewritten with the addition: the
    step summary) and opens a special file with O_APPEND.  Raises OSError.
    """
    where = destination(name)
    if where.kind == "fd":
        with _flushed_dup(where.fd) as f:
            yield f
    elif where.kind == "special" and stat.S_ISSOCK(where.mode):
        with _connected(where.path) as f:
            yield f
    elif where.kind == "special":
        flags = os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC | (os.O_APPEND if append else 0)
        with os.fdopen(os.open(where.path, flags), "wb") as f:
            yield f
    else:
        before = _old_contents(where.path) if append else b""
        with atomic_file(where.path, mode) as f:
            f.write(before)
            yield f


@contextlib.contextmanager
def _flushed_dup(fd: int) -> Iterator[BinaryIO]:
    """Our descriptor `fd`, duplicated so that closing the writer leaves it open; Python's
    own buffer for it is flushed first so that text already printed stays before."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):
            if stream.fileno() == fd:
                stream.flush()
    with os.fdopen(os.dup(fd), "wb") as f:
        yield f


@contextlib.contextmanager
def _connected(path: str) -> Iterator[BinaryIO]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        with sock.makefile("wb") as f:
            yield f


def _old_contents(path: str) -> bytes:
    """What a regular file held (the step summary before this step's part), read without
    following a link or waiting on a FIFO put there meanwhile."""
    from refcntd.inputs.safefs import UntrustedFileError, open_untrusted
    try:
        with open_untrusted(path, SUMMARY_LIMIT, what="output") as old:
            return old.read_all()
    except UntrustedFileError:
        return b""


SUMMARY_LIMIT = 64 << 20  # GitHub itself caps a step summary at 1 MiB


def write_output(name: str, data: bytes, mode: int = 0o644) -> None:
    """`data` to the output `name` (output_file); raises OSError."""
    with output_file(name, mode) as f:
        f.write(data)
