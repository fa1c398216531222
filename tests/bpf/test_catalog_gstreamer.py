"""Bundled spec gstreamer on Debian's GStreamer 1.22, as installed, against
GStreamer's own leaks tracer (GST_TRACERS=leaks) on the same run."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from catalog import Outcome, assert_balanced, assert_double_caught, build, trace

ALIVE = re.compile(r"object-alive, type-name=\(string\)(\w+), address=\(gpointer\)(0x[0-9a-f]+)"
                   r".*?ref-count=\(uint\)(\d+)")
TRACER_ENV = {"GST_TRACERS": "leaks", "GST_DEBUG": "GST_TRACER:7", "GST_DEBUG_NO_COLOR": "1"}


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    program = build(tmp_path_factory.mktemp("gst"), "gstobjs.c", ["gstreamer-1.0"])
    # On a fresh machine the first gst_init forks gst-plugin-scanner to build the
    # plugin registry (~/.cache/gstreamer-1.0): a process of GStreamer's, with its own
    # leaks, that the balanced run would then report. Build the registry untraced.
    subprocess.run([str(program), "balanced"], check=True, capture_output=True)
    return program


def with_tracer(tmp_path, exe, variant: str) -> tuple[Outcome, dict[int, int]]:
    """refcntd and the leaks tracer on one run: refcntd's outcome, and what the
    tracer lists alive at gst_deinit (address -> reference count)."""
    out = trace(tmp_path, "gstreamer", [str(exe), variant], env={**os.environ, **TRACER_ENV})
    return out, {int(a, 16): int(n) for _, a, n in ALIVE.findall(out.stderr)}


def leaked(out: Outcome) -> dict[int, int]:
    return {addr: count for (_, addr), count in out.leaks.items()}


GST_OBJECT_CHECKS = {"gst_object_ref", "gst_object_unref", "gst_object_ref_sink",
                     "gst_object_set_parent", "gst_object_unparent"}


@pytest.mark.parametrize("options", [(), ("--no-leak-kinds",)])
def test_balanced_program_reports_nothing(bpf, exe, tmp_path, options):
    """GstObjects' flag read at the exit scan; without one (--no-leak-kinds), by the
    spec's check probes on gst_object_* (`unless_scanned`), as before the scan did."""
    out = trace(tmp_path, "gstreamer", [str(exe), "balanced"], options=options)
    assert_balanced(out)
    notes = out.report["tracing"]["notes"]  # pad templates, static caps: GStreamer's flag
    assert any("may be leaked" in n for n in notes), notes
    assert any(n.startswith("10 objects kept alive by their dispose") for n in notes), notes
    assert not [n for n in notes if "never fired" in n], notes
    checks = {p["function"] for p in out.report["tracing"]["probes"] if p["role"] == "check"}
    assert checks == (GST_OBJECT_CHECKS if options else set())  # not even probed with a scan


def test_leaks_are_exact(bpf, exe, tmp_path):
    """The program's books; the leaked identity's two pads come on top."""
    out = trace(tmp_path, "gstreamer", [str(exe), "leak"])
    books = {addr: count for (_, addr), count in out.truth.items()}
    got = leaked(out)
    assert {a: got.get(a) for a in books} == books, out.stderr
    extra = {a: c for a, c in got.items() if a not in books}
    assert sorted(extra.values()) == [1, 1], out.stderr  # identity0:sink, identity0:src
    assert [a for a in out.anomalies if not a["separate"]] == []


def set_aside(out: Outcome) -> int:
    """The objects the report says GStreamer flags "may be leaked"."""
    found = [int(n.split()[0]) for n in out.report["tracing"]["notes"]
             if "may be leaked" in n]
    assert len(found) == 1, out.report["tracing"]["notes"]
    return found[0]


def test_same_objects_as_the_leaks_tracer(bpf, exe, tmp_path):
    """Object for object, with the same reference counts, on the same run.  The
    only other refcntd reports is the leaks tracer's factory, which it cannot
    list (made before it started watching): exactly the one refcntd reports on a
    balanced program under the tracer, where the tracer lists none.  The tracer's
    4 records are GstObjects it flags "may be leaked" (gstleaks.c), set aside by
    the flag read at the exit scan (a probe on gst_object_* calls never saw them
    flagged: none is made on them after the flag is set)."""
    base, base_alive = with_tracer(tmp_path, exe, "balanced")
    assert base_alive == {}
    own = leaked(base)
    plain = trace(tmp_path, "gstreamer", [str(exe), "balanced"])
    assert set_aside(base) == set_aside(plain) + 4  # the tracer's records
    out, alive = with_tracer(tmp_path, exe, "leak")
    assert len(alive) == 5, out.stderr  # buffer, caps, identity and its two pads
    got = leaked(out)
    assert {a: got.get(a) for a in alive} == alive, out.stderr
    extra = {a: c for a, c in got.items() if a not in alive}
    assert sorted(extra.values()) == sorted(own.values()), out.stderr
    assert list(own.values()) == [2]  # the tracer's factory


def test_real_double_unref_is_caught(bpf, exe, tmp_path):
    assert_double_caught(trace(tmp_path, "gstreamer", [str(exe), "double"]))
