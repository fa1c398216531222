"""The streamed JSON writer produces exactly the document run_json() describes."""

from __future__ import annotations

import json

from refcntd.analysis.model import (
    HistoryStep,
    LeakedObject,
    LeakGroup,
    ProcessReport,
    RunResult,
)
from refcntd.outputs import reportjson
from refcntd.symbolize.symbolizer import Frame


def _result(objects_per_group: int) -> RunResult:
    frames = (Frame("/bin/x", 0x1000, 'quote"d', 4, "x.c", 12), Frame("", 0x2000, raw="ip 0x2"))
    step = HistoryStep("get", 2, frames, 5)
    groups = [LeakGroup(name, frames, [LeakedObject(0x1000 + 16 * i, i % 3, i, i // 2, 7 * i)
                                       for i in range(objects_per_group)])
              for name in ("dso", "@@refcntd-instances-0@@", "ünï\n")]
    groups[0].objects.append(LeakedObject(0xdead, 1, 1, 0, 9, (step,), 3))
    procs = [ProcessReport(42, "x", ["x", "--a b"], "exited", "exit 0", 0, groups),
             ProcessReport(43, "y", [], "exited")]
    return RunResult("run", "perf-stubs", "x", procs)


def test_streamed_json_is_run_json(tmp_path):
    for n in (0, 1, 5, 45):
        result = _result(n)
        path = tmp_path / f"r{n}.json"
        reportjson.write_json(result, str(path))
        assert json.loads(path.read_text()) == json.loads(json.dumps(reportjson.run_json(result)))
    chunks = list(reportjson.iter_json(_result(45), chunk_objects=10))
    assert "".join(chunks) == path.read_text()


def test_saved_operations_read_back_and_a_wrong_type_is_a_malformed_report(tmp_path):
    """--baseline reads a run anyone may have written: operations and frames of the
    wrong type are refused with one line, not met later as a crash in the analysis."""
    import pytest

    from refcntd.analysis.pathops import PathOp
    from refcntd.errors import UsageError
    from refcntd.kernel.abi import Role
    from refcntd.outputs.runjson import load_run
    result = _result(1)
    ops = [PathOp(Role.PUT, (Frame("/bin/x", 0x1000, "dso__put", 4, "x.c", 12),), 3)]
    result.processes[0].operations = {"dso": ops}
    path = tmp_path / "r.json"
    reportjson.write_json(result, str(path))
    assert load_run(str(path)).processes[0].operations == {"dso": ops}
    good = json.loads(path.read_text())
    for field, value in (("count", "3"), ("count", -1), ("count", True), ("op", "delete"),
                         ("type", 5)):
        bad = json.loads(json.dumps(good))
        bad["processes"][0]["operations"][0][field] = value
        path.write_text(json.dumps(bad))
        with pytest.raises(UsageError, match="malformed refcntd report"):
            load_run(str(path))
    for field, value in (("function", 5), ("line", "12"), ("offset", None)):
        bad = json.loads(json.dumps(good))
        bad["processes"][0]["operations"][0]["stack"][0][field] = value
        path.write_text(json.dumps(bad))
        with pytest.raises(UsageError, match="malformed refcntd report"):
            load_run(str(path))
