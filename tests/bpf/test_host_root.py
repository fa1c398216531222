"""A program named through /proc/PID/root (issue 56): refcntd in a container with
--pid=host traces the host's programs by their path in the host's root.  Proved
without a container: refcntd runs in a mount namespace of its own where the
program's directory is covered by an empty tmpfs, so the file is reachable only
through /proc/<pytest's pid>/root; the program runs outside it, where the kernel
names it by its plain path.  The report must be the exact one a host run gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import REFCNTD, ROOT
from test_attach import Attached
from test_run import PERFLIKE_LEAKS, assert_perflike_truth
from test_serve import Serve, metric, target_yaml


def hiding(directory: Path) -> tuple[str, ...]:
    """A command prefix: its command runs where `directory` is an empty tmpfs."""
    return ("unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs refcntd-test "{directory}" && exec "$@"', "sh")


def hidden_program(build, tmp_path: Path) -> tuple[Path, str]:
    """(perflike's path here, the same file through this process's root)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    exe = hidden / "perflike"
    shutil.copy2(build.perflike("O2fp"), exe)
    return exe, f"/proc/{os.getpid()}/root{exe}"


@pytest.mark.parametrize("where", ["other-namespace", "same-namespace"])
def test_serve_traces_a_program_by_its_path_through_proc_pid_root(bpf, build, tmp_path, where):
    """serve's target `path: /proc/PID/root/...`: attached through that root, and the
    processes the kernel reports by the plain path are the target's, with exact counts
    and resolved frames.  In the same namespace the prefix names our own root."""
    exe, rooted = hidden_program(build, tmp_path)
    wrap = hiding(exe.parent) if where == "other-namespace" else ()
    if wrap:  # the premise: refcntd there cannot see the file by its plain path
        probe = subprocess.run([*wrap, "ls", str(exe), rooted], capture_output=True, text=True)
        assert probe.returncode != 0 and "No such file" in probe.stderr, probe
        assert probe.stdout.strip() == rooted, probe
    with Serve(tmp_path, target_yaml("host", Path(rooted)), wrap=wrap) as serve:
        assert f"binary={rooted} attached (" in serve.log, serve.log
        runs = [subprocess.Popen([str(exe)], stdout=subprocess.DEVNULL) for _ in range(2)]
        assert [r.wait(timeout=60) for r in runs] == [0, 0]
        for run in runs:  # every exit reported before the scrape
            serve.wait_log(f"target=host pid={run.pid} ", 30)
        time.sleep(0.5)
        m = serve.scrape()
        assert serve.stop() == 0, serve.log
    for type_name, counts in PERFLIKE_LEAKS.items():
        assert metric(m, "refcntd_leaked_objects_total", target="host",
                      type=type_name) == 2 * len(counts)
    assert metric(m, "refcntd_processes_reported_total", target="host") == 2
    assert metric(m, "refcntd_probes", target="host", state="failed") == 0
    reports = sorted(serve.reports.glob("*.json"))
    assert len(reports) == 2
    for path in reports:
        (process,) = json.loads(path.read_text())["processes"]
        assert_perflike_truth(process)  # frames resolved in the file read through the root


def test_run_and_attach_a_program_through_proc_pid_root(bpf, build, tmp_path):
    """`run -- /proc/PID/root/...` and `attach --binary /proc/PID/root/...` from the
    namespace where the plain path is an empty directory."""
    exe, rooted = hidden_program(build, tmp_path)
    report = tmp_path / "run.json"
    result = subprocess.run([*hiding(exe.parent), *REFCNTD, "run", "--json", str(report),
                             "--", rooted], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 23, result.stderr
    (process,) = json.loads(report.read_text())["processes"]
    assert_perflike_truth(process)
    with Attached(["--binary", rooted], tmp_path / "a.json",
                  prefix=list(hiding(exe.parent))) as att:
        assert subprocess.run([str(exe)], stdout=subprocess.DEVNULL, timeout=60).returncode == 0
        time.sleep(1)  # its exit reported
        status, out, data = att.stop()
    assert status == 0, att.err
    (process,) = data["processes"]
    assert_perflike_truth(process)
    assert out.count("SUMMARY: refcntd: 8 objects of 3 types leaked") == 1
