"""`attach --pid` ends with its process tree; `run` takes CMD down with it (issue 18)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from conftest import FIXTURES, REFCNTD, ROOT, leak_summary
from test_attach import start_waiter
from test_run import assert_perflike_truth


def test_attach_pid_ends_when_the_tree_is_gone(bpf, build, tmp_path):
    """The parent exits at once; a descendant goes on for a second, then leaks: attach
    stops by itself after that descendant, with its report, and no SIGINT."""
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    script = tmp_path / "parent.sh"
    script.write_text(f"#!/bin/sh\necho ready\nread line\n(sleep 1; {perflike}) &\nexit 0\n")
    script.chmod(0o755)
    parent = start_waiter(script)
    json_path = tmp_path / "a.json"
    att = subprocess.Popen([*REFCNTD, "attach", "--json", str(json_path), "--binary", str(lib),
                            "--pid", str(parent.pid)], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        while "attached to" not in seen and att.poll() is None:
            seen += att.stderr.readline()
        assert "attached to" in seen, seen
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0
        out, err = att.communicate(timeout=60)  # no signal sent: it must end by itself
    finally:
        if att.poll() is None:
            att.kill()
    assert att.returncode == 0, err
    report = json.loads(json_path.read_text())
    (leaking,) = [p for p in report["processes"] if p["groups"]]
    assert leaking["command"] == [str(perflike)] and leaking["state"] == "exited"
    assert_perflike_truth(leaking)


def test_attach_live_objects_are_not_called_leaks(bpf, build, tmp_path):
    lib = build.stub_lib("O0")
    waiter = build.program("waiter", [FIXTURES / "waiter.c"], "O0", shared_stubs=True)
    holder = start_waiter(waiter, "hold")
    try:
        from test_attach import Attached
        with Attached(["--binary", str(lib), "--pid", str(holder.pid), "--history"],
                      tmp_path / "a.json") as att:
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "holding"
            time.sleep(0.3)
            code, out, report = att.stop()
    finally:
        holder.kill()
        holder.wait()
    assert code == 0
    (live,) = report["processes"]
    assert live["state"] == "live at detach" and leak_summary(live) == {"session": [2]}
    assert not re.search(r"Leaked|leaked objects|[1-9][0-9]* objects? of .* leaked", out), out
    assert "Live 1 object of type 'session'" in out
    assert "still live at detach" in out


def _children(pid: int, exe: Path) -> list[int]:
    """`pid`'s children running `exe` (refcntd may have helpers of its own running)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    found = []
    for child in map(int, text.split()):
        try:
            if Path(f"/proc/{child}/exe").resolve() == exe.resolve():
                found.append(child)
        except OSError:
            continue
    return found


def test_sigkilled_run_takes_its_command_down(bpf, build, tmp_path):
    waiter = build.program("waiter", [FIXTURES / "waiter.c"], "O2")
    run = subprocess.Popen([*REFCNTD, "run", "--", str(waiter)], cwd=ROOT, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cmd = 0
    try:
        assert run.stdout.readline().strip() == "ready"  # CMD runs, blocked on its stdin
        (cmd,) = _children(run.pid, waiter)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{cmd}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{cmd}").exists(), "CMD outlived its SIGKILLed refcntd"
    finally:
        for pid in (run.pid, cmd):
            if pid and Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
