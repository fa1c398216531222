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
from typing import NamedTuple

from refcntd.errors import InputFileError

TEXT_LIMIT = 64 << 20  # specs, configs, suppressions: far larger is a wrong file
REPORT_LIMIT = 1 << 30  # saved runs (--json) of big programs
HOLLOW_OVER = 256 << 20  # a file this big whose disk blocks cover under 1/16 of it ...
HOLLOW_SHARE = 16


def hollow(info: os.stat_result) -> str | None:
    """Why a file is refused as mostly holes, or None.  Every reader here reads a file
    whole: a 3 GiB memfd holding a 200 KiB library and a hole costs the process that
    maps it nothing and refcntd 3 GiB (6 GiB of refcntd's memory, measured, when a nobody
    process dlopen()ed one: tests/bpf/test_untrusted.py).  No ELF file, spec or report
    has holes; a compressing file system stores a binary in 1/2 to 1/4 of its size."""
    if info.st_size > HOLLOW_OVER and info.st_blocks * 512 * HOLLOW_SHARE < info.st_size:
        return f"mostly holes ({info.st_size} bytes, {info.st_blocks * 512} on disk)"
    return None


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
        if why := hollow(info):
            raise InputFileError(f"{what} {name}: {why}")
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


MINORBITS = 20  # the kernel's own dev_t (include/linux/kdev_t.h): MAJOR << 20 | MINOR


class FileStamp(NamedTuple):
    """What stat says of a file: which file it is, and which version of it."""

    dev: int  # st_dev, as user space sees it
    ino: int
    size: int
    mtime_ns: int

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode): the same file, whatever is written to it later."""
        return self.dev, self.ino

    @property
    def kernel_dev(self) -> int:
        """st_dev as the kernel encodes it inside (inode->i_sb->s_dev): what BPF reads."""
        return os.major(self.dev) << MINORBITS | os.minor(self.dev)


def file_stamp(path: str | os.PathLike[str] | int) -> FileStamp | None:
    """The stamp of the file at `path` (or open descriptor): it changes when the file is
    rewritten or replaced; None when there is none.  The one stat of a file's identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(device, inode) of the file at `path` now (a replaced file has a new one); None
    when there is none."""
    stamp = file_stamp(path)
    return None if stamp is None else stamp.identity
