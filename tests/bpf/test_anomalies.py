"""Anomalies caught as they happen: kinds, counts, offending and allocation stacks."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, assert_probe_mode, refcntd

EXPECTED = {  # kind -> (function that did it, count before, reported apart)
    "double-put": ("double_put_site", 0, False),
    "negative-count": ("negative_count_site", -1, False),
    "put-after-delete": ("put_after_delete_site", 0, False),
    "get-after-delete": ("get_after_delete_site", 0, False),
    "delete-live": ("delete_live_site", 1, False),
    "double-delete": ("double_delete_site", 0, False),
    "unknown-get": ("unknown_get_site", 0, True),
}


@pytest.mark.parametrize("variant", ["O0", "O2"])
def test_each_anomaly_kind_once_at_its_site(bpf, build, tmp_path, variant, probe_mode):
    exe = build.program("anomalies", [FIXTURES / "anomalies.c"], variant)
    result = refcntd(["run", "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert_probe_mode(result.report, probe_mode)
    (process,) = result.report["processes"]
    assert process["groups"] == []  # no leak: every object was deleted
    found = {a["kind"]: a for a in process["anomalies"]}
    assert sorted(found) == sorted(EXPECTED)
    for kind, (site, count_before, separate) in EXPECTED.items():
        a = found[kind]
        assert a["occurrences"] == 1, a
        assert a["separate"] is separate
        assert [f.get("function") for f in a["stack"]][:2][-1] == site, a["stack"]
        if kind in ("double-put", "negative-count", "delete-live"):
            assert a["count_before"] == count_before
        if separate:
            assert a["alloc_stack"] == []
        else:
            assert a["alloc_stack"][1]["function"] == "obj_new", a["alloc_stack"]
    assert result.report["anomalies"] == 6  # the never-seen get is not counted as a finding
    assert "ANOMALY double-put: put on an object whose count was already 0" in result.stderr
    assert "NOTE unknown-get" in result.stderr


def test_gets_and_puts_on_different_threads_are_not_anomalies(bpf, build, tmp_path):
    exe = build.program("handoff", [FIXTURES / "handoff.c"], "O2", flags=["-pthread"])
    result = refcntd(["run", "--", str(exe), "3000"], tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    (process,) = result.report["processes"]
    assert process["anomalies"] == [] and process["groups"] == []
    assert result.report["tracing"]["complete"]
