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


def test_balanced_program_reports_nothing(bpf, exe, tmp_path):
    out = trace(tmp_path, "gstreamer", [str(exe), "balanced"])
    assert_balanced(out)
    notes = out.report["tracing"]["notes"]  # pad templates, static caps: GStreamer's flag
    assert any("may be leaked" in n for n in notes), notes
    assert any(n.startswith("10 objects kept alive by their dispose") for n in notes), notes
    assert not [n for n in notes if "never fired" in n], notes


def test_leaks_are_exact(bpf, exe, tmp_path):
    """The program's books; the leaked identity's two pads come on top."""
    out = trace(tmp_path, "gstreamer", [str(exe), "leak"])
    books = {addr: count for (_, addr), count in out.truth.items()}
    got = leaked(out)
    assert {a: got.get(a) for a in books} == books, out.stderr
    extra = {a: c for a, c in got.items() if a not in books}
    assert sorted(extra.values()) == [1, 1], out.stderr  # identity0:sink, identity0:src
    assert [a for a in out.anomalies if not a["separate"]] == []


def test_same_objects_as_the_leaks_tracer(bpf, exe, tmp_path):
    """Object for object, with the same reference counts, on the same run.  The
    only others refcntd reports are the leaks tracer's own objects, which it
    cannot list (made before it started watching): exactly the ones refcntd
    reports on a balanced program under the tracer, where the tracer lists none."""
    base, base_alive = with_tracer(tmp_path, exe, "balanced")
    assert base_alive == {}
    own = leaked(base)
    out, alive = with_tracer(tmp_path, exe, "leak")
    assert len(alive) == 5, out.stderr  # buffer, caps, identity and its two pads
    got = leaked(out)
    assert {a: got.get(a) for a in alive} == alive, out.stderr
    extra = {a: c for a, c in got.items() if a not in alive}
    assert sorted(extra.values()) == sorted(own.values()), out.stderr
    assert len(own) == 5  # 4 tracer records (count 1) and the tracer's factory (count 2)


def test_real_double_unref_is_caught(bpf, exe, tmp_path):
    assert_double_caught(trace(tmp_path, "gstreamer", [str(exe), "double"]))
