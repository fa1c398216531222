"""A saved run's plain instance arrays read as columns render every format exactly as
the per-object loader does; a file they would not read back the same (booleans,
negative ages, addresses out of order, other keys, a token where no group takes it)
is read object by object, and a broken one fails with the same message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refcntd.analysis.model import Holder, LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.errors import UsageError
from refcntd.inputs.files import REPORT_LIMIT, read_text
from refcntd.outputs import reportjson, runjson, savedcolumns
from refcntd.outputs.formats import RENDERERS
from refcntd.outputs.policy import Policy
from refcntd.symbolize.symbolizer import Frame

FRAMES = (Frame("/bin/x", 0x1000, "make", 4, "x.c", 12), Frame("", 0x2000, raw="ip 0x2"))


def _result(n: int, held: bool = False) -> RunResult:
    names = ("dso", 'x"instances": [{"a": 1}]', "]},{", "ünï\n")
    groups = [LeakGroup(name, FRAMES[k % 2:], [LeakedObject(0x100000 * (k + 1) + 16 * i, i % 3 - 1,
                                                            i, i // 2, 7 * i * 10**12)
                                               for i in range(n)])
              for k, name in enumerate(names)]
    if held:  # an object held by one of a plain group (written with held_by, read per object)
        groups.append(LeakGroup("map", FRAMES, [LeakedObject(
            0xbeef0, 2, 2, 0, 5, history_total=1, leak="indirect",
            held_by=(Holder(0x100000, "dso", 1, FRAMES),))]))
    procs = [ProcessReport(42, "x", ["x"], "exited", "exit 0", 0, groups),
             ProcessReport(43, "y", [], "live at detach", groups=[LeakGroup("dso", FRAMES, [
                 LeakedObject(0x100000, 1, 1, 0, 0)])])]
    return RunResult("run", "perf-stubs", "x", procs)


def _slow(path: Path) -> RunResult:
    text = read_text(str(path), "saved report", REPORT_LIMIT)
    return runjson._parse(str(path), "saved report", text, lambda _items: None)


def _rendered(result: RunResult) -> list[str | bytes]:
    verdict = Policy.build(None, [], []).evaluate(result)
    return [*(render(result, verdict, Path(".")) for render in RENDERERS.values()),
            "".join(reportjson.iter_json(result))]


def _columns_used(result: RunResult) -> bool:
    return any(isinstance(g.objects, savedcolumns.SavedObjects)
               for p in result.processes for g in p.groups)


def _saved(tmp_path: Path, result: RunResult, edit=lambda text: text) -> Path:
    path = tmp_path / "run.json"
    reportjson.write_json(result, str(path))
    path.write_text(edit(path.read_text()))
    return path


@pytest.mark.parametrize("n", [1, 7, 300])
def test_columns_render_like_objects(tmp_path, monkeypatch, n) -> None:
    monkeypatch.setattr(savedcolumns, "_CHUNK_CHARS", 150)  # many chunks of a few objects
    path = _saved(tmp_path, _result(n))
    fast = runjson.load_run(str(path))
    assert _columns_used(fast)
    assert _rendered(fast) == _rendered(_slow(path))
    assert fast.processes[0].groups[0].objects[n // 2:] == \
        _slow(path).processes[0].groups[0].objects[n // 2:]


def test_reformatted_file_still_read_as_columns(tmp_path) -> None:
    path = _saved(tmp_path, _result(40), lambda text: json.dumps(json.loads(text), indent=1))
    fast = runjson.load_run(str(path))
    assert _columns_used(fast) and _rendered(fast) == _rendered(_slow(path))


def test_plain_objects_held_by_listed_ones_are_searched_as_owners(tmp_path) -> None:
    path = _saved(tmp_path, _result(5, held=True))
    fast = runjson.load_run(str(path))
    assert _columns_used(fast)
    assert not any(getattr(g.objects, "without_ownership", False)
                   for p in fast.processes for g in p.groups)
    assert _rendered(fast) == _rendered(_slow(path))


@pytest.mark.parametrize("old, new", [
    ('"count": 1,', '"count": true,'),            # array("q") would take it as 1
    ('"age_ns": 0}', '"age_ns": -5}'),             # LeakedObjects would show 0
    ('"puts": 0,', '"puts": 0, "leak": "x",'),      # a key the columns do not keep
    ('"address": "0x100010"', '"address": "0x1"'),  # out of order: kept as written
    ('"address": "0x100000"', '"address": "0x1ffffffffffffffff"'),
])
def test_what_columns_would_not_read_back_is_read_per_object(tmp_path, old, new) -> None:
    path = _saved(tmp_path, _result(6), lambda text: text.replace(old, new, 1))
    assert new in path.read_text()
    fast, slow = runjson.load_run(str(path)), _slow(path)
    assert not isinstance(fast.processes[0].groups[0].objects, savedcolumns.SavedObjects)
    assert _rendered(fast) == _rendered(slow)


def test_an_instances_key_outside_a_group(tmp_path) -> None:
    """Cut like a group's, never taken by one: the whole file is read per object."""
    plain = '[{"address": "0x1", "count": 1, "gets": 0, "puts": 0, "age_ns": 0}]'
    path = _saved(tmp_path, _result(3), lambda text: text.replace(
        '"lost": {}', f'"lost": {{"instances": {plain}}}', 1))
    assert f'"instances": {plain}' in path.read_text()
    fast = runjson.load_run(str(path))
    assert not _columns_used(fast) and fast.tracing.lost == {"instances": json.loads(plain)}


def test_a_broken_file_fails_as_it_did(tmp_path) -> None:
    path = _saved(tmp_path, _result(3), lambda text: text[:-40])
    with pytest.raises(UsageError) as fast:
        runjson.load_run(str(path))
    with pytest.raises(UsageError) as slow:
        _slow(path)
    assert str(fast.value) == str(slow.value) and ": not JSON (" in str(fast.value)
