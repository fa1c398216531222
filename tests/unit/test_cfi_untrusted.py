"""kernel/cfi.py on modules traced processes name (issue 28): readelf by absolute path
on the descriptor refcntd checked, and the cache written without following links."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_input_files import alarm  # noqa: F401 - a fixture: a FIFO waited on fails

from refcntd.errors import BinaryError
from refcntd.kernel import cfi

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.usefixtures("alarm")
def test_fifo_or_device_as_module_is_refused_at_once(tmp_path):
    fifo = tmp_path / "libx.so"
    os.mkfifo(fifo)
    with pytest.raises(BinaryError, match="is a FIFO, not a regular file"):
        cfi.load_table(str(fifo), cache_dir=tmp_path)
    with pytest.raises(BinaryError, match="is a character device"):
        cfi.load_table("/dev/zero", cache_dir=tmp_path)


def test_readelf_by_absolute_path_on_the_checked_descriptor(tmp_path, monkeypatch):
    """No PATH lookup, `--` before the name, the C locale (its output is parsed), and
    the file read is the descriptor refcntd opened, whatever the name holds meanwhile."""
    calls: list[tuple[list[str], dict]] = []
    real_run = subprocess.run

    def spy(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append((args, kwargs))
        Path(tmp_path / "libc.so.6").unlink()  # the name changes while readelf runs
        return real_run(args, **kwargs)  # type: ignore[call-overload, no-any-return]
    (tmp_path / "libc.so.6").write_bytes(Path(LIBC).read_bytes())
    monkeypatch.setattr(subprocess, "run", spy)
    table = cfi.load_table(str(tmp_path / "libc.so.6"), cache_dir=tmp_path / "cache")
    assert table.count > 1000
    ((args, kwargs),) = calls
    assert args[:3] == ["/usr/bin/readelf", "--debug-dump=frames-interp", "--"]
    assert args[3].startswith("/proc/self/fd/") and kwargs["pass_fds"] == (int(args[3][14:]),)
    assert kwargs["env"] == {"LC_ALL": "C", "PATH": "/usr/bin"}


def test_cache_file_replaces_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    cache = tmp_path / "cache"
    first = cfi.load_table(LIBC, cache_dir=cache)
    (entry,) = cache.iterdir()
    entry.unlink()
    entry.symlink_to(victim)
    assert cfi.load_table(LIBC, cache_dir=cache).rows == first.rows
    assert victim.read_text() == "untouched" and not entry.is_symlink()
