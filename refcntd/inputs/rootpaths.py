"""Paths through /proc/PID/root: a file of another mount namespace, named through the
root of a process that lives there (refcntd in a container with `--pid=host` tracing
the host's programs, as Parca's and Tetragon's agents name them).

os.path.realpath reads the /proc/PID/root link itself, which the kernel shows from
another mount namespace as "/": the path would fall back into refcntd's own root, to
another file or none.  Here the prefix is kept (the kernel follows it when a file is
opened or a uprobe attached), the links after it are resolved inside that root, and
what that root's processes are reported by (/proc/N/exe, /proc/N/maps) is the part
after the prefix.  Every path of a binary or library refcntd resolves goes through
`resolve`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MAX_LINKS = 40  # as the kernel's path walk (ELOOP beyond)


def split_root(path: str | os.PathLike[str], proc: Path = Path("/proc")) -> tuple[str, str]:
    """(root, inner): `root` is "/proc/PID/root" when `path` goes through the root of a
    process that sees other files than this one (another mount namespace or chroot),
    else ""; `inner` is the absolute path inside that root."""
    name = os.path.normpath(os.path.abspath(path))
    match = re.match(re.escape(str(proc)) + r"/(\d+|self|thread-self)/root(?=/|$)", name)
    if match is None or _own_root(match[1], proc):
        return "", name
    return match[0], name[match.end():] or "/"


def resolve(path: str | os.PathLike[str], proc: Path = Path("/proc")) -> str:
    """os.path.realpath, except that a path through a foreign /proc/PID/root keeps that
    prefix and its links (absolute ones too) resolve inside that root."""
    root, inner = split_root(path, proc)
    if not root:
        return os.path.realpath(inner)
    return root + _inside(root, inner)


def seen_inside(path: str | os.PathLike[str], proc: Path = Path("/proc")) -> str:
    """The path the kernel reports for processes of the root `path` goes through
    (their /proc/N/exe and maps): `path` without a foreign /proc/PID/root prefix."""
    return split_root(path, proc)[1]


def beside(like: str | os.PathLike[str], path: str, proc: Path = Path("/proc")) -> str:
    """`path` as the processes of `like`'s root name it (a PT_INTERP, a RUNPATH, an
    exe the kernel reported), made openable here: in that root, resolved."""
    root = split_root(like, proc)[0]
    if not root or split_root(path, proc)[0]:
        return resolve(path, proc)
    return resolve(root + os.path.normpath("/" + path), proc)


def _own_root(pid: str, proc: Path) -> bool:
    """Whether /proc/`pid`/root is this process's root: the same mount namespace and
    the same directory.  One that cannot be read is not (opening a file through it
    then says why)."""
    try:
        if pid not in ("self", "thread-self") and \
                os.readlink(proc / pid / "ns" / "mnt") != os.readlink(proc / "self/ns/mnt"):
            return False
        theirs, ours = os.stat(proc / pid / "root"), os.stat(proc / "self/root")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def _inside(root: str, inner: str) -> str:
    """`inner` with its links resolved as a process whose root is `root` would: an
    absolute link starts again at that root, `..` never leaves it.  A missing part
    ends the links to follow, as os.path.realpath does."""
    done, todo, links = "/", [p for p in inner.split("/") if p], 0
    while todo:
        part = todo.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        candidate = os.path.join(done, part)
        try:
            target = os.readlink(root + candidate)
        except OSError:  # not a link, or missing
            done = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            return os.path.join(candidate, *todo)
        done = "/" if target.startswith("/") else done
        todo = [p for p in target.split("/") if p] + todo
    return done
