"""refcntd under the shipped unit's exact capabilities and system call filter, in a
session of its own as systemd starts it (tests/bpf/unit_sandbox.py), tracing a program
that runs as `nobody` and dlopen()s a module while its exported get/put are probed at
their call sites: the process is stopped for the scan and always continued, and without
CAP_KILL refcntd never stops it at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import leak_summary
from test_attach import Attached
from test_callsites import TRUTH, build_fixture
from unit_sandbox import UNIT, confined, unit_caps


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory `nobody` can read and run from (pytest's tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="refcntd-caps-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_as_nobody(exe: Path, plugin: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           str(exe), str(plugin)], capture_output=True, text=True,
                          timeout=60)  # a process left stopped would time out here


def traced(caps: list[str], build, shared_dir: Path, tmp_path: Path) -> tuple[dict, str]:
    """attach, confined, on csmain run as nobody; the report and refcntd's /proc status."""
    exe, plugin = build_fixture(build, shared_dir)
    for path in shared_dir.rglob("*"):
        path.chmod(0o755)
    with Attached(["--binary", str(exe), "--probe-mode", "callsites"], tmp_path / "a.json",
                  prefix=confined(caps)) as attached:
        status = Path(f"/proc/{attached.proc.pid}/status").read_text()
        ran = run_as_nobody(exe, plugin)
        code, _out, report = attached.stop()
    assert ran.returncode == 0, ran.stderr
    assert code == 0, attached.seen
    assert "Traceback" not in attached.seen, attached.seen
    return report, status


def test_the_units_capabilities_stop_and_continue_a_nobody_process(bpf, build, shared_dir,
                                                                    tmp_path):
    caps = unit_caps()
    assert "kill" in caps
    report, status = traced(caps, build, shared_dir, tmp_path)
    cap_eff = int(next(x for x in status.splitlines() if x.startswith("CapEff:")).split()[1],
                  16)
    assert cap_eff & (1 << 21) == 0, "CAP_SYS_ADMIN must not be there"  # truly confined
    assert "Seccomp:\t2" in status  # and filtered
    (process,) = [p for p in report["processes"] if p["comm"] == "csmain"]
    assert leak_summary(process) == TRUTH
    notes = " | ".join(report["tracing"]["notes"])
    assert "1 stop(s) of a traced process to scan" in notes, notes
    assert "could NOT be continued" not in notes, notes
    assert not list(Path("/run/refcntd/held").glob(f"{os.getpid()}-*"))


def test_without_cap_kill_no_process_is_ever_stopped(bpf, build, shared_dir, tmp_path):
    """The unit as it once shipped: refcntd cannot continue another user's process, so
    the exported functions go back to their entry probes and the counts stay exact."""
    caps = [c for c in unit_caps() if c != "kill"]
    report, _status = traced(caps, build, shared_dir, tmp_path)
    (process,) = [p for p in report["processes"] if p["comm"] == "csmain"]
    assert leak_summary(process) == TRUTH
    notes = " | ".join(report["tracing"]["notes"])
    assert "stop(s) of a traced process" not in notes, notes
    assert "lacks CAP_KILL" in notes, notes


def test_a_refused_sigcont_is_reported_not_raised(other_user):
    """What refcntd does when SIGCONT is refused (EPERM): resume() says why, the caller
    keeps the pid, retries it and reports it; here proven by a resume() run as nobody
    against a root process."""
    # another session: the kernel lets SIGCONT through within one session, whoever sends it
    victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        code = "import sys; from refcntd.session.vetting import resume; " \
            "print(resume(int(sys.argv[1])))"  # refcntd as nobody reaches it (otheruser.py)
        out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                              other_user.python, "-c", code, str(victim.pid)],
                             capture_output=True, text=True, cwd="/", env=other_user.env,
                             timeout=60)
    finally:
        victim.kill()
        victim.wait()
    assert out.stdout.strip() == "SIGCONT failed: Operation not permitted", out.stderr


def test_unit_exposure_is_at_most_3():
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager",
                          str(UNIT)], capture_output=True, text=True)
    (line,) = [x for x in out.stdout.splitlines() if "Overall exposure level" in x]
    exposure = float(line.split(":")[1].split()[0])
    assert exposure <= 3.0, out.stdout
