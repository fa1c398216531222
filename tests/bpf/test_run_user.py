"""`run --user`: CMD runs unprivileged while refcntd traces it as root; and the files
root writes after CMD cannot be redirected by CMD (a planted symlink changes nothing)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXAMPLES, cc, refcntd
from test_run import assert_perflike_truth, lib_spec


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


def shared_perflike(shared_dir: Path) -> Path:
    """perflike with its stubs in librefcnt.so, both where nobody can load them."""
    lib = cc(shared_dir / "librefcnt.so", [EXAMPLES / "refcnt.c"],
             ["-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared"])
    exe = cc(shared_dir / "perflike", [EXAMPLES / "perflike.c"],
             ["-O2", "-fno-omit-frame-pointer", f"-L{shared_dir}", "-lrefcnt",
              f"-Wl,-rpath,{shared_dir}"])
    for path in (lib, exe):
        path.chmod(0o755)
    return exe


def test_a_symlink_planted_by_cmd_at_an_output_path_is_replaced_not_followed(
        bpf, shared_dir, tmp_path):
    """CMD, as nobody, plants symlinks at the --json path and at GITHUB_STEP_SUMMARY,
    both pointing at a root-only file, while refcntd traces it: refcntd replaces each
    link with its own file, and the root file is untouched."""
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    exe = shared_perflike(shared_dir)
    out, summary = shared_dir / "report.json", shared_dir / "summary.md"
    script = shared_dir / "plant.sh"
    script.write_text(f"#!/bin/sh\nln -s {victim} {out}\nln -s {victim} {summary}\n"
                      f"exec {exe}\n")
    script.chmod(0o755)
    result = refcntd(["run", "--user", "nobody", "--spec", str(lib_spec(tmp_path, exe.parent /
                      "librefcnt.so")), "--json", str(out), "--", str(script)],
                     env={**os.environ, "GITHUB_ACTIONS": "true",
                          "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 23, result.stderr
    assert victim.read_text() == "precious\n"
    assert stat.S_ISREG(out.lstat().st_mode) and stat.S_ISREG(summary.lstat().st_mode)
    processes = json.loads(out.read_text())["processes"]  # sh, its two ln, perflike
    (process,) = [p for p in processes if p["groups"]]
    assert_perflike_truth(process)
    assert "refcntd" in summary.read_text()
