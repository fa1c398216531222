"""--history: per-object get/put stacks, bounds, and culprit attribution (real BPF)."""

from __future__ import annotations

from conftest import refcntd


def test_history_depth_must_be_a_power_of_two(tmp_path):
    from conftest import assert_one_line_error
    result = refcntd(["run", "--history", "--history-depth", "12", "--", "/bin/true"])
    assert_one_line_error(result, "--history-depth: 12: must be a power of two")
