"""`refcntd attach`: system-wide and per-pid, with reports per exiting process."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from conftest import FIXTURES, REFCNTD, ROOT, leak_summary
from test_run import assert_perflike_truth


class Attached:
    """A running `refcntd attach`, stopped with SIGINT even if the test fails."""

    def __init__(self, args: list[str], json_path: Path, prefix: list[str] | None = None
                 ) -> None:
        """`prefix`: a command that runs refcntd (setpriv, setsid)."""
        self.json_path = json_path
        self.proc = subprocess.Popen([*(prefix or []), *REFCNTD, "attach", "--json",
                                      str(json_path), *args],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.seen, self.waited = "", 0
        self.err: str | None = None  # stderr after stop()
        self._wait_for("attached to", 60)

    def _wait_for(self, needle: str, timeout: float) -> None:
        """Raw reads: a text buffer would hide the lines after the first from select."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()
        while needle not in self.seen[self.waited:] and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.seen += chunk.decode(errors="replace")
            elif self.proc.poll() is not None:
                break
        if needle in self.seen[self.waited:]:
            self.waited = self.seen.index(needle, self.waited) + len(needle)
            return
        self.proc.kill()
        raise AssertionError(f"refcntd attach: no {needle!r}: {self.seen}")

    def stop(self) -> tuple[int, str, dict]:
        self.proc.send_signal(signal.SIGINT)
        out, self.err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, json.loads(self.json_path.read_text())

    def __enter__(self) -> Attached:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_waiter(exe: Path, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_system_wide_attach_on_a_library(bpf, build, tmp_path):
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    waiter = build.program("waiter", [FIXTURES / "waiter.c"], "O2", shared_stubs=True)
    holder = start_waiter(waiter, "hold")  # running before the attach
    try:
        with Attached(["--binary", str(lib)], tmp_path / "a.json") as att:
            runs = [subprocess.run([str(perflike)], capture_output=True) for _ in range(2)]
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "holding"
            time.sleep(0.5)
            code, out, report = att.stop()
    finally:
        holder.kill()
        holder.wait()
    assert code == 0, out
    assert all(r.returncode == 0 for r in runs)
    exited = [p for p in report["processes"] if p["state"] == "exited"]
    assert sorted(p["command"][0] for p in exited) == [str(perflike)] * 2
    for process in exited:
        assert_perflike_truth(process)
    (live,) = [p for p in report["processes"] if p["pid"] == holder.pid]
    assert live["state"] == "live at detach"
    assert leak_summary(live) == {"session": [2]}
    assert report["leaked_objects"] == 16  # live objects are not leaks
    assert "still live at detach in process" in out
    assert "Live 1 object of type 'session' (count now 2)" in out  # not "final count"
    assert "refcntd: detached from " + str(lib) + ": 3 process(es) reported, 1 of them " \
        "still running" in att.seen + (att.err or "")
    assert out.count("SUMMARY: refcntd: 8 objects of 3 types leaked") == 2


def attach_to_pid(lib: Path, target: subprocess.Popen, unrelated: Path, json_path: Path
                  ) -> tuple[subprocess.CompletedProcess, dict]:
    """Attach to `target` (waiting at its "ready"), run `unrelated` meanwhile, then let
    the target go and report; the target is killed if anything fails."""
    try:
        with Attached(["--binary", str(lib), "--pid", str(target.pid)], json_path) as att:
            other = subprocess.run([str(unrelated)], capture_output=True)
            target.stdin.write("go\n")
            target.stdin.flush()
            assert target.wait(timeout=30) == 0
            time.sleep(0.5)
            _, _, report = att.stop()
    finally:
        if target.poll() is None:
            target.kill()
    return other, report


def test_attach_to_one_pid_ignores_other_processes(bpf, build, tmp_path):
    lib = build.stub_lib("O0")
    waiter = build.program("waiter", [FIXTURES / "waiter.c"], "O0", shared_stubs=True)
    perflike = build.perflike("O0", shared_stubs=True)
    target = start_waiter(waiter)
    other, report = attach_to_pid(lib, target, perflike, tmp_path / "a.json")
    assert other.returncode == 0
    assert [p["pid"] for p in report["processes"]] == [target.pid]
    (process,) = report["processes"]
    assert process["state"] == "exited" and process["exit_status"] == "exit 0"
    assert leak_summary(process) == {"session": [2]}
    assert process["groups"][0]["stack"][1]["function"] == "session_open"


def test_attach_to_a_pid_follows_its_descendants(bpf, build, tmp_path):
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    script = tmp_path / "parent.sh"
    script.write_text(f"#!/bin/sh\necho ready\nread line\n{perflike}\n{perflike}\n")
    script.chmod(0o755)
    parent = start_waiter(script)
    unrelated, report = attach_to_pid(lib, parent, perflike, tmp_path / "a.json")
    assert unrelated.returncode == 0
    leaking = [p for p in report["processes"] if p["groups"]]
    assert len(leaking) == 2, report["processes"]
    for process in leaking:
        assert process["command"] == [str(perflike)]
        assert_perflike_truth(process)
