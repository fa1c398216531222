"""kept_by_library: objects a library keeps on purpose are set aside and counted."""

from __future__ import annotations

from refcntd.analysis.kept import set_aside
from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport
from refcntd.inputs.spec import KeptRule
from refcntd.symbolize.symbolizer import Frame

GLIB = "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0.7400.6"


def group(type_name: str, module: str, function: str = "", n: int = 1) -> LeakGroup:
    frame = Frame(module, 0x1000, function=function)
    return LeakGroup(type_name, (frame,), [LeakedObject(0x10 * i, 1, 0, 0, 0) for i in range(n)])


def test_first_frame_module_and_type_decide():
    rule = KeptRule("GHashTable", ("libglib-2.0.so*",), "GLib's tables")
    own = group("GHashTable", GLIB, n=3)
    mine = group("GHashTable", "/usr/bin/prog")
    other_type = group("GVariant", GLIB)
    report = ProcessReport(1, "prog", ["prog"], "exited", groups=[own, mine, other_type])
    set_aside(report, (rule,))
    assert report.groups == [mine, other_type]
    assert report.kept == {"GLib's tables": 3}


def test_function_pattern_and_any_type():
    rule = KeptRule(None, ("gst_static_caps_*",), "static caps")
    report = ProcessReport(1, "p", [], "exited",
                           groups=[group("GstMiniObject", GLIB, "gst_static_caps_get")])
    set_aside(report, (rule,))
    assert report.groups == [] and report.kept == {"static caps": 1}
