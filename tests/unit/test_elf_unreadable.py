"""A binary path refcntd may not look at (a container's /proc/1/root/... where PID 1
cannot be ptraced: EACCES from stat) is one line, not a traceback."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError


def test_permission_denied_is_a_binary_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(self: Path, *args: object, **kw: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "stat", denied)
    with pytest.raises(BinaryError, match=r"^/proc/1/root/usr/bin/perf: Permission denied$"):
        ElfImage(Path("/proc/1/root/usr/bin/perf"))
