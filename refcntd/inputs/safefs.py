"""File-system safety for a root process that reads paths other users chose.

refcntd runs as root; traced processes and local users are not trusted.  They
choose paths refcntd opens (/tmp/perf-PID.map, a library's .gnu_debuglink,
the names in a process's link_map) and can put anything there: a FIFO that
never answers, a device whose open has side effects, a symbolic link to a
file only root may read, a file of gigabytes.  This module is the one place
that opens such paths, checks the directories refcntd trusts with its own
files, and writes files so that nothing planted at the target is followed.

* `open_untrusted` resolves the path to an O_PATH descriptor first (openat2,
  Linux >= 5.6: no symbolic link anywhere in the path unless asked; inside a
  container's root with RESOLVE_IN_ROOT), checks that one inode with fstat
  (regular file, size cap, owner), and only then opens it for reading through
  /proc/self/fd: a FIFO is never waited on and a device is never opened.
* `trusted_dir` is OpenSSH's StrictModes for directories.
* `atomic_write` writes a temporary file and renames it over the target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import BinaryIO

from refcntd.errors import InputFileError
from refcntd.inputs.files import hollow, kind_of

_SYS_OPENAT2 = 437  # x86-64, the only architecture refcntd traces
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
NO_SUCH_FILE = "no such file"
ELF_LIMIT = 4 << 30  # an ELF or debug file is read whole into memory


class UntrustedFileError(InputFileError):
    """A file chosen by someone else was refused or could not be read: the message is the
    one line a report shows (what and path, then why)."""

    def __init__(self, shown: str, reason: str) -> None:
        super().__init__(f"{shown}: {reason}")
        self.shown, self.reason = shown, reason

    @property
    def missing(self) -> bool:
        return self.reason == NO_SUCH_FILE


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class UntrustedFile:
    """A checked regular file open for reading (a context manager; `close` it)."""

    def __init__(self, file: BinaryIO, shown: str, max_size: int) -> None:
        self.file, self.shown, self.max_size = file, shown, max_size

    @property
    def fd_path(self) -> str:
        """/proc/self/fd name of this inode, for readers that take a path: they read
        what was checked, whatever is put at the original path meanwhile."""
        return f"/proc/self/fd/{self.file.fileno()}"

    def read_all(self) -> bytes:
        """The whole file; one that grew past the cap while it was read is refused too."""
        try:
            data = self.file.read(self.max_size + 1)
        except OSError as err:
            raise UntrustedFileError(self.shown, f"cannot read ({err.strerror})") from None
        if len(data) > self.max_size:
            raise UntrustedFileError(self.shown, f"too big (more than {self.max_size} "
                                     "bytes)")
        return data

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> UntrustedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_untrusted(path: str | os.PathLike[str], max_size: int, *, what: str = "file",
                   owners: Collection[int] | None = None, follow_symlinks: bool = False,
                   root_fd: int | None = None) -> UntrustedFile:
    """The regular file at `path`, open for reading.

    Refused (UntrustedFileError) when the path holds a symbolic link (unless
    `follow_symlinks`), is not a regular file, is larger than `max_size`, or is
    owned by a uid outside `owners` (None: any owner).  With `root_fd` (an
    O_PATH or directory descriptor of a container's root) `path` is resolved
    inside that root, symbolic links included: none leads out of it.
    """
    shown = f"{what} {os.fspath(path)}"
    fd = _resolve(os.fspath(path), follow_symlinks, root_fd, shown)
    try:
        _check(os.fstat(fd), max_size, owners, shown)
        readable = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                           | os.O_NOCTTY)
    except OSError as err:
        raise UntrustedFileError(shown, f"cannot open ({err.strerror})") from None
    finally:
        os.close(fd)
    return UntrustedFile(os.fdopen(readable, "rb"), shown, max_size)


def _resolve(name: str, follow: bool, root_fd: int | None, shown: str) -> int:
    """An O_PATH descriptor of `name`: opening one neither blocks nor touches a device."""
    flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    resolve = 0 if follow else _RESOLVE_NO_SYMLINKS
    if root_fd is not None:
        resolve |= _RESOLVE_IN_ROOT
        name = name.lstrip("/") or "."
    try:
        return _openat2(root_fd if root_fd is not None else -100, name, flags, resolve)
    except OSError as err:
        raise UntrustedFileError(shown, _why(err)) from None


def _openat2(dir_fd: int, name: str, flags: int, resolve: int) -> int:
    """openat2(2); where it is missing (seccomp, an old kernel) O_NOFOLLOW guards the last
    component only, and a root_fd is refused rather than resolved outside its root."""
    how = _OpenHow(flags, 0, resolve)
    fd = _libc().syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(dir_fd),
                         ctypes.c_char_p(os.fsencode(name)), ctypes.byref(how),
                         ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err not in (errno.ENOSYS, errno.EPERM) or resolve & _RESOLVE_IN_ROOT:
        raise OSError(err, os.strerror(err))
    return os.open(name, flags, dir_fd=None if dir_fd == -100 else dir_fd)


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _LIBC.append(libc)
    return _LIBC[0]


def _check(info: os.stat_result, max_size: int, owners: Collection[int] | None,
           shown: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedFileError(shown, "is a symbolic link, not followed")
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedFileError(shown, f"{kind_of(info.st_mode)}, not a regular file")
    if info.st_size > max_size:
        raise UntrustedFileError(shown, f"too big ({info.st_size} bytes; at most {max_size})")
    if why := hollow(info):
        raise UntrustedFileError(shown, why)
    if owners is not None and info.st_uid not in owners:
        allowed = " or ".join(str(u) for u in sorted(owners))
        raise UntrustedFileError(shown, f"owned by uid {info.st_uid}, not by uid {allowed}")


def _why(err: OSError) -> str:
    if err.errno == errno.ENOENT:
        return NO_SUCH_FILE
    if err.errno == errno.ELOOP:
        return "a symbolic link in its path, not followed"
    if err.errno == errno.EXDEV:
        return "leads out of its root"
    return f"cannot open ({err.strerror})"


def trusted_dir(path: str | os.PathLike[str]) -> str | None:
    """None when only root (or this process's euid) can change what `path` holds; else
    why not, in a few words naming the directory at fault.

    Like OpenSSH's StrictModes: the directory and every directory above it, as
    written and as symbolic links resolve it, must be owned by root or the euid;
    `path` itself must not be group- or world-writable.  A directory above it
    may be if it is sticky (/tmp): there others can add entries but cannot
    rename or remove ours, and the next directory down must still be ours.
    A symbolic link on the way must be owned by root or the euid (in a sticky
    directory its owner may replace it).
    """
    allowed = {0, os.geteuid()}
    given = Path(os.path.abspath(path))
    real = Path(os.path.realpath(given))
    chains = [real, *real.parents, given, *given.parents]
    for directory in dict.fromkeys(chains):  # each once, the target first
        problem = _dir_problem(directory, allowed, last=directory == real)
        if problem:
            return problem
    return None


def _dir_problem(directory: Path, allowed: set[int], last: bool) -> str | None:
    try:
        info = os.lstat(directory)
    except OSError as err:
        return f"{directory}: {_why(err)}"
    if info.st_uid not in allowed:
        return f"{directory} is owned by uid {info.st_uid}, not root"
    if stat.S_ISLNK(info.st_mode):
        return None  # its owner is checked; where it leads is in the resolved chain
    if not stat.S_ISDIR(info.st_mode):
        return f"{directory} is not a directory"
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (last or not info.st_mode & stat.S_ISVTX):
        return f"{directory} is writable by group or others"
    return None


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` all at once (atomic_file)."""
    with atomic_file(path, mode) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` all at once when the block ends: readers see
    the old file or the new one, and a big report is streamed, never held in memory.

    The new file is made by mkstemp in the target's directory (O_EXCL, a name
    no one can predict, never through a link), written, fsynced and renamed
    over `path`.  Whatever was at `path` (a planted symbolic link) is replaced,
    never followed.  Raises OSError; the temporary file does not survive it.
    """
    target = os.path.abspath(path)
    directory, base = os.path.split(target)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """The rename itself survives a crash once the directory is synced (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
