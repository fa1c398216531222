"""The examples build with their own Makefile (no BPF; `refcntd run` on them, with
their known leaks, is tested in tests/bpf/test_run.py)."""

from __future__ import annotations

from conftest import EXAMPLES


def test_example_makefile_builds(tmp_path):
    import subprocess
    subprocess.run(["make", "-s", "-C", str(EXAMPLES), f"BUILD={tmp_path}"], check=True)
    assert (tmp_path / "perflike").exists()
