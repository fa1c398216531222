"""A process refcntd stopped (to scan a module it dlopen()ed) is continued on every
exit path of refcntd: SIGTERM, and SIGKILL, which the guardian process covers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_attach import Attached
from test_callsites import build_fixture
from test_unit_caps import shared_dir  # noqa: F401 - a fixture


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_state(pid: int, wanted: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if state(pid) == wanted:
                return True
        except OSError:
            return False
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_process_held_when_refcntd_goes_is_continued(bpf, build, shared_dir,  # noqa: F811
                                                      tmp_path, how):
    exe, plugin = build_fixture(build, shared_dir)
    for path in shared_dir.rglob("*"):
        path.chmod(0o755)
    with Attached(["--binary", str(exe), "--probe-mode", "callsites"],
                  tmp_path / "a.json") as attached:
        os.kill(attached.proc.pid, signal.SIGSTOP)  # refcntd cannot scan: the hold stays
        app = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup",
                                "--clear-groups", str(exe), str(plugin)],
                               start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            assert wait_state(app.pid, "T", 30), "the BPF side did not stop the program"
            if how == "SIGKILL":
                os.kill(attached.proc.pid, signal.SIGKILL)
            else:
                os.kill(attached.proc.pid, signal.SIGCONT)
                os.kill(attached.proc.pid, signal.SIGTERM)
            assert app.wait(timeout=30) == 0  # continued, and ran to its end
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()
        attached.proc.wait(timeout=60)
