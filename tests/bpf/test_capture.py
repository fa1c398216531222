"""Capture is never blocked: reports are built on a worker, the ring buffer keeps being read.

The fixture's child leaks 200 000 objects and exits; right after, its parent
sends 3 000 anomaly events into a 64 KiB ring buffer (about 600 records) over
about 1.5 s.  Building, symbolizing and rendering the child's report takes
longer than the buffer can hold: when that ran on the capture thread, events
were lost here.  Now every event must arrive and nothing be counted lost.
"""

from __future__ import annotations

import os

import pytest
from conftest import FIXTURES, refcntd

OBJECTS, PUTS = 200_000, 3_000


@pytest.mark.serial  # its reader must keep up with a 16-page ring: no other worker beside it
def test_events_all_received_while_a_big_report_is_built(bpf, build, tmp_path):
    exe = build.program("capture", [FIXTURES / "capture.c"], "O2")
    env = {**os.environ, "REFCNTD_RINGBUF_PAGES": "16"}
    result = refcntd(["run", "--", str(exe), str(OBJECTS), str(PUTS)], tmp_path / "r.json",
                     env=env, timeout=300)
    assert result.returncode == 23, result.stderr[-2000:]
    tracing = result.report["tracing"]
    assert tracing["lost"] == {}, tracing
    child, parent = sorted(result.report["processes"], key=lambda p: len(p["anomalies"]))
    assert sum(len(g["instances"]) for g in child["groups"]) == OBJECTS
    assert {g["stack"][1]["function"] for g in child["groups"]} == {"bulk_new"}
    assert parent["groups"] == []
    kinds: dict[str, int] = {}  # one kind can be found at several call sites of put_site
    for a in parent["anomalies"]:
        kinds[a["kind"]] = kinds.get(a["kind"], 0) + a["occurrences"]
    assert kinds == {"double-put": 1, "negative-count": PUTS - 1, "delete-live": 1}, kinds
    assert {a["stack"][1]["function"] for a in parent["anomalies"]
            if a["kind"] != "delete-live"} == {"put_site"}

