"""kept_by_library from GLib's own valgrind file (glib.supp), on Debian's stripped
libraries: GLib's one-time tables made under exported functions are kept by its
entries, by name and counted; tables made under static functions are not (their
frames have no name here), and the spec's `created_in` rule still keeps those."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog import build, trace
from conftest import ROOT

GLIB_SUPP = Path("/usr/share/glib-2.0/valgrind/glib.supp")
pytestmark = pytest.mark.skipif(not GLIB_SUPP.exists(), reason="glib.supp (libglib2.0-dev)")


def spec_with_supp_only(tmp_path: Path) -> Path:
    """The bundled glib spec with glib.supp as its only kept rule."""
    text = (ROOT / "configs/specs/glib.yaml").read_text()
    spec = tmp_path / "glib-supp-only.yaml"
    spec.write_text(text[:text.index("kept_by_library:")] + "kept_by_library:\n"
                    f"  - {{valgrind: {GLIB_SUPP}, reason: glib.supp}}\n")
    return spec


def test_glib_supp_keeps_gios_one_time_tables(bpf, tmp_path):
    exe = build(tmp_path, "gliboneshots.c", ["gio-2.0"])
    out = trace(tmp_path, str(spec_with_supp_only(tmp_path)), [str(exe)])
    (label,) = out.process["kept_by_library"]
    assert out.process["kept_by_library"][label] == 6, out.stderr
    leak_entries = [line.strip() for line in GLIB_SUPP.read_text().splitlines()].count(
        "Memcheck:Leak")  # 96 in Debian 12's GLib 2.74, 104 in Debian 13's 2.84
    assert label.startswith(f"glib.supp (glib.supp: 4 of {leak_entries} entries used: "), label
    for entry in ("g_dbus_error_quark x2", "g-get-language_names-with-category-malloc x2",
                  "g_io_extension_point_register x1",
                  "g_socket_connection_factory_register_type x1"):
        assert entry in label, label
    # GLib's and GObject's own tables, made in static functions: `???` frames here
    left = {g["stack"][0]["module"].split("/")[-1].split(".so")[0] for g in out.process["groups"]}
    assert left <= {"libglib-2.0", "libgobject-2.0"}, out.stderr
    assert all(not g["stack"][0].get("function") for g in out.process["groups"]), out.stderr



def test_bundled_glib_spec_keeps_everything_it_makes(bpf, tmp_path):
    exe = build(tmp_path, "gliboneshots.c", ["gio-2.0"])
    out = trace(tmp_path, "glib", [str(exe)])
    assert out.process["groups"] == [], out.stderr
    assert sum(out.process["kept_by_library"].values()) == 11, out.stderr
