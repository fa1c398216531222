"""The one safe reader for every input file (spec, config, suppressions, saved report,
baseline, binary).

Why: a FIFO must not block (`check` hung on one), a directory or device is not
a file, a huge file must not be read into memory by mistake, and a file that is
not UTF-8 must give one line naming it, never a traceback.
"""

from __future__ import annotations

import errno
import os
import stat

from refcntd.errors import InputFileError

TEXT_LIMIT = 64 << 20  # specs, configs, suppressions: far larger is a wrong file
REPORT_LIMIT = 1 << 30  # saved runs (--json) of big programs


def open_regular(path: str | os.PathLike[str], what: str, limit: int | None = TEXT_LIMIT
                 ) -> int:
    """A read descriptor of the regular file at `path`. The path is resolved to an O_PATH
    descriptor first and checked before it is opened for reading: a FIFO is refused, not
    waited on, and a device is never opened (opening one can act: a tape rewinds)."""
    name = os.fspath(path)
    try:
        where = os.open(name, os.O_PATH | os.O_CLOEXEC)
    except OSError as err:
        raise InputFileError(f"{what} {name}: {_why(err)}") from None
    try:
        info = os.fstat(where)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{what} {name}: {kind_of(info.st_mode)}, not a regular file")
        if limit is not None and info.st_size > limit:
            raise InputFileError(f"{what} {name}: too big ({info.st_size} bytes; at most "
                                 f"{limit})")
        return os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InputFileError(f"{what} {name}: cannot read ({err.strerror})") from None
    finally:
        os.close(where)


def read_bytes(path: str | os.PathLike[str], what: str, limit: int | None = TEXT_LIMIT) -> bytes:
    """The whole regular file (open_regular's checks)."""
    fd = open_regular(path, what, limit)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as err:
        raise InputFileError(f"{what} {os.fspath(path)}: cannot read ({err.strerror})") from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], what: str, limit: int = TEXT_LIMIT) -> str:
    """read_bytes, decoded as strict UTF-8 (the error says where the first bad byte is)."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start:err.start + 1].hex()
        raise InputFileError(f"{what} {os.fspath(path)}: not UTF-8 text (byte 0x{bad} at "
                             f"offset {err.start})") from None


def _why(err: OSError) -> str:
    if err.errno == errno.ENOENT:
        return "no such file"
    return f"cannot open ({err.strerror})"


def kind_of(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "is a directory"), (stat.S_ISFIFO, "is a FIFO"),
                       (stat.S_ISSOCK, "is a socket"), (stat.S_ISCHR, "is a character device"),
                       (stat.S_ISBLK, "is a block device")):
        if test(mode):
            return kind
    return "is not a regular file"


def file_stamp(path: str | os.PathLike[str]) -> tuple[int, ...] | None:
    """(device, inode, size, mtime) of the file at `path`: changes when it is rewritten or
    replaced; None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
