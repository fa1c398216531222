"""Caches are code: a cache directory another user can change is not used (one warning
line; the default or a private one instead), and entries are never read through links."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import refcntd
from test_run import assert_perflike_truth


@pytest.fixture
def sticky() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="refcntd-trust-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*cmd: str) -> None:
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *cmd],
                   check=True)


def test_a_cache_directory_of_another_user_is_not_used(bpf, build, sticky, tmp_path):
    planted = sticky / "cache"
    as_nobody("mkdir", str(planted))
    env = {**os.environ, "REFCNTD_CACHE": str(planted)}
    result = refcntd(["run", "--", str(build.perflike("O2fp"))], tmp_path / "r.json", env=env)
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert_perflike_truth(process)
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert f"cache directory {planted} not used: {planted} is owned by uid " in warning
    assert list(planted.iterdir()) == []  # nothing written into it


@pytest.mark.parametrize("mode", [0o777, 0o775])
def test_a_cache_directory_others_may_write_is_not_used(bpf, build, tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    result = refcntd(["check", "--binary", str(build.perflike("O2fp"))],
                     env={**os.environ, "REFCNTD_CACHE": str(shared)})
    assert result.returncode == 0, result.stderr
    assert f"{shared} is writable by group or others" in result.stderr
    assert list(shared.iterdir()) == []


def test_cache_entries_are_not_read_through_links(tmp_path):
    from refcntd.paths import read_cache, read_cache_json
    secret = tmp_path / "secret"
    secret.write_text('{"key": "value"}')
    link = tmp_path / "entry.json"
    link.symlink_to(secret)
    assert read_cache(link) is None and read_cache_json(link) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert read_cache(fifo) is None  # at once: never waits for a writer
    assert read_cache_json(secret) == {"key": "value"}
