"""Bundled spec cairo on Debian's libcairo 1.16, as installed."""

from __future__ import annotations

import pytest
from catalog import assert_balanced, assert_double_caught, assert_exact_leaks, build, trace


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("cairo"), "cairoobjs.c", ["cairo"])


def test_balanced_program_reports_nothing(bpf, exe, tmp_path):
    out = trace(tmp_path, "cairo", [str(exe), "balanced"])
    assert_balanced(out)
    notes = out.report["tracing"]["notes"]  # cairo's static black source, skipped and counted
    assert any("static objects" in n for n in notes), notes


def test_leaks_are_exact(bpf, exe, tmp_path):
    assert_exact_leaks(trace(tmp_path, "cairo", [str(exe), "leak"]))


def test_real_double_destroy_is_caught(bpf, exe, tmp_path):
    """cairo asserts on the second destroy (SIGABRT): refcntd saw it first."""
    out = trace(tmp_path, "cairo", [str(exe), "double"])
    assert_double_caught(out)
    assert out.process["exit_status"] == "killed by SIGABRT"
