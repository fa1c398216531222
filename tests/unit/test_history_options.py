"""--history's options are checked before any work: --history-depth must be a power of
two (no BPF; --history itself is tested in tests/bpf/test_history.py)."""

from __future__ import annotations

from conftest import refcntd


def test_history_depth_must_be_a_power_of_two(tmp_path):
    from conftest import assert_one_line_error
    result = refcntd(["run", "--history", "--history-depth", "12", "--", "/bin/true"])
    assert_one_line_error(result, "--history-depth: 12: must be a power of two")
