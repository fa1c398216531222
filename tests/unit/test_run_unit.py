"""`refcntd run` against compiled fixtures with known leaks: exact reports."""

from __future__ import annotations

from conftest import EXAMPLES

# The truth documented in examples/perflike.c for the default 100 samples.




















def test_example_makefile_builds(tmp_path):
    import subprocess
    subprocess.run(["make", "-s", "-C", str(EXAMPLES), f"BUILD={tmp_path}"], check=True)
    assert (tmp_path / "perflike").exists()




