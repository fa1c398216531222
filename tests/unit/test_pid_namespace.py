"""`run`, `attach` and `serve` refuse to trace from a PID namespace of their own: the
kernel reports the host's PIDs, and in a container without --pid=host `run` traced
nothing and exited 0 with "0 processes traced" (podman 4.3, the refcntd image)."""

from __future__ import annotations

import os

import pytest

from refcntd.errors import EnvironmentProblem
from refcntd.kernel import setup


def test_the_initial_namespace_passes():
    if os.stat("/proc/self/ns/pid").st_ino != setup.PROC_PID_INIT_INO:
        pytest.fail("this test machine itself runs in a child PID namespace")
    setup.require_host_pids()


def test_another_namespace_is_one_line_with_the_remedy(tmp_path):
    other = tmp_path / "pid"
    other.write_text("")  # any inode but the initial namespace's
    with pytest.raises(EnvironmentProblem) as err:
        setup.require_host_pids(str(other))
    assert "PID namespace of its own" in err.value.message
    assert "--pid=host" in (err.value.remedy or "")
    assert err.value.exit_code == 24


def test_no_namespace_file_is_not_an_error(tmp_path):
    setup.require_host_pids(str(tmp_path / "absent"))
