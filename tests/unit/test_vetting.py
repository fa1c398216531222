"""A process left stopped by a refcntd that died mid-scan is continued by the next
one (real processes and signals; no BPF)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refcntd.session import vetting


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def stopped():
    child = subprocess.Popen(["sleep", "60"])
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while state(child.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    yield child
    child.kill()
    child.wait()


def marker(held: Path, owner: int, tgid: int, started: str | None) -> Path:
    held.mkdir(parents=True, exist_ok=True)
    path = held / f"{owner}-{tgid}"
    path.write_text(started or "")
    return path


def dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_dead_refcntds_stopped_process_is_continued(tmp_path, monkeypatch, stopped):
    monkeypatch.setattr(vetting, "HELD_DIR", tmp_path / "held")
    left = marker(tmp_path / "held", dead_pid(), stopped.pid,
                  vetting._start_time(stopped.pid))
    assert vetting.continue_orphans() == [stopped.pid]
    assert state(stopped.pid) != "T" and not left.exists()


@pytest.fixture
def other():
    """Another refcntd, alive (as _alive sees one)."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "refcntd"])
    deadline = time.monotonic() + 5  # the kernel sets the new argv a moment after exec
    while not vetting._alive(owner.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    yield owner
    owner.kill()
    owner.wait()


def test_a_live_refcntds_process_is_left_alone(tmp_path, monkeypatch, stopped, other):
    monkeypatch.setattr(vetting, "HELD_DIR", tmp_path / "held")
    kept = marker(tmp_path / "held", other.pid, stopped.pid, vetting._start_time(stopped.pid))
    assert vetting.continue_orphans() == []
    assert state(stopped.pid) == "T" and kept.exists()


def test_a_process_another_refcntd_holds_too_is_left_for_it_to_continue(
        tmp_path, monkeypatch, stopped, other):
    """Two instances stop a process that maps a module whose exported functions they
    probe at call sites; the first done must not continue it before the other's
    probes are in (tests/bpf/test_reliability.py's two instances lost a process's
    calls). Its marker goes, the other's stays and the process stays stopped; once the
    other is gone without continuing it, the next retry does."""
    monkeypatch.setattr(vetting, "HELD_DIR", tmp_path / "held")
    theirs = marker(tmp_path / "held", other.pid, stopped.pid,
                    vetting._start_time(stopped.pid))
    ours = vetting.mark_held(stopped.pid)
    assert ours is not None
    v = object.__new__(vetting.Vetting)  # only its resume bookkeeping is used
    v.stuck, v.others = {}, {}
    v._resume(stopped.pid, ours)
    assert state(stopped.pid) == "T" and not ours.exists() and theirs.exists()
    v._retry_stuck()
    assert state(stopped.pid) == "T"
    other.kill()
    other.wait()
    v._retry_stuck()
    assert state(stopped.pid) != "T" and not v.others


def test_a_reused_pid_is_not_signalled(tmp_path, monkeypatch, stopped):
    monkeypatch.setattr(vetting, "HELD_DIR", tmp_path / "held")
    stale = marker(tmp_path / "held", dead_pid(), stopped.pid, "1")  # another start time
    assert vetting.continue_orphans() == []
    assert state(stopped.pid) == "T" and not stale.exists()


def test_mark_held_names_this_refcntd_and_the_process(tmp_path, monkeypatch, stopped):
    monkeypatch.setattr(vetting, "HELD_DIR", tmp_path / "held")
    path = vetting.mark_held(stopped.pid)
    assert path is not None and path.name == f"{os.getpid()}-{stopped.pid}"
    assert path.read_text() == vetting._start_time(stopped.pid)
