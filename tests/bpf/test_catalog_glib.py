"""Bundled specs gobject and glib on Debian's libgobject/libglib 2.74, as installed."""

from __future__ import annotations

import pytest
from catalog import assert_balanced, assert_double_caught, assert_exact_leaks, build, trace

PKGS = ["gobject-2.0"]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("glib"), "glibtypes.c", PKGS)


@pytest.mark.parametrize("spec", ["gobject", "glib"])
def test_balanced_program_reports_nothing(bpf, exe, tmp_path, spec):
    out = trace(tmp_path, spec, [str(exe), spec, "balanced"])
    assert_balanced(out)
    if spec == "glib":  # GLib's own tables are set aside by the spec, and counted
        assert sum(out.process["kept_by_library"].values()) >= 1


@pytest.mark.parametrize("spec", ["gobject", "glib"])
def test_leaks_are_exact(bpf, exe, tmp_path, spec):
    out = trace(tmp_path, spec, [str(exe), spec, "leak"])
    assert_exact_leaks(out)


def test_two_specs_at_once_count_both_apis(bpf, exe, tmp_path):
    """--spec gobject --spec glib: one run counts GObjects and GLib's own refcounted
    types, each leak exact, as each spec alone does on its half."""
    out = trace(tmp_path, ["gobject", "glib"], [str(exe), "both", "leak"])
    assert {t for t, _ in out.truth} >= {"GObject", "GBytes"}, out.truth
    assert_exact_leaks(out)
    assert out.report["spec"] == "gobject+glib"


@pytest.mark.parametrize("spec", ["gobject", "glib"])
def test_real_double_unref_is_caught(bpf, exe, tmp_path, spec):
    assert_double_caught(trace(tmp_path, spec, [str(exe), spec, "double"]))


def test_gbytes_unref_to_data_and_array_on_every_path(bpf, exe, tmp_path):
    """The last reference stolen (no g_bytes_unref), copied with g_bytes_unref inside,
    a reference others hold: exact, no anomaly, no record replaced at a reused address."""
    assert_exact_leaks(trace(tmp_path, "glib", [str(exe), "glib", "unrefto"]))


def test_roles_that_never_fire_are_reported(bpf, exe, tmp_path):
    """The glib spec on the GObject-only run: its GBytes and GVariant roles are idle."""
    notes = trace(tmp_path, "glib", [str(exe), "gobject", "balanced"]).report["tracing"]["notes"]
    silent = [n for n in notes if "never fired" in n]
    assert any("g_bytes_new_with_free_func" in n for n in silent), notes
    assert not any("g_hash_table_new_full" in n for n in silent), notes  # GLib's own tables
