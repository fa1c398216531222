"""`run --user`: CMD runs unprivileged while refcntd traces it as root; and the files
root writes after CMD cannot be redirected by CMD (a planted symlink changes nothing)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import refcntd
from test_run import assert_perflike_truth


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory `nobody` can read, run from and write to (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="refcntd-user-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_cmd_runs_as_the_user_and_is_traced_exactly(bpf, build, shared_dir, tmp_path):
    exe = shutil.copy(build.perflike("O2fp"), shared_dir / "perflike")
    os.chmod(exe, 0o755)
    result = refcntd(["run", "--user", "nobody", "--", exe], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert_perflike_truth(process)
    # the same program where only root may run it: nobody cannot, so it was nobody
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    hidden = shutil.copy(exe, private / "perflike")
    denied = refcntd(["run", "--user", "nobody:nogroup", "--", hidden], tmp_path / "d.json")
    assert "cannot run" in denied.stderr and "Permission denied" in denied.stderr, denied.stderr
    assert denied.report["command_status"] == 127
