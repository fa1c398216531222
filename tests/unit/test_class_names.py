"""The spec's `class:`, groups split by the class the scan read, and how each output
shows it while names, keys and fingerprints keep the spec's type."""

from __future__ import annotations

from pathlib import Path

import pytest

from refcntd.analysis.classes import apply_classes
from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.errors import ConfigError
from refcntd.inputs.spec import ClassSource, KeptFlag, load_spec
from refcntd.outputs import ciformats, report, reportjson, runjson
from refcntd.outputs.policy import collect_findings
from refcntd.reach.gtypes import ClassNames
from refcntd.symbolize.symbolizer import Frame

SPEC = """\
version: 1
name: g
roles:
  init: {functions: [g_new], object: return, type: {name: GObject}, class: CLASS}
  get: {functions: [g_ref], object: arg1}
  put: {functions: [g_unref], object: arg1}
"""
FRAMES = (Frame("/lib/libgobject.so", 0x10, "g_object_new", 1),
          Frame("/bin/app", 0x20, "make", 2))


def spec_with(tmp_path: Path, value: str):
    path = tmp_path / "s.yaml"
    path.write_text(SPEC.replace("CLASS", value))
    return load_spec(str(path))


def test_class_sources_of_the_spec(tmp_path) -> None:
    assert spec_with(tmp_path, "{gtype: instance}").class_sources() == {
        "GObject": ClassSource(instance=True)}
    assert spec_with(tmp_path, "{gtype: 16}").class_sources() == {
        "GObject": ClassSource(offset=16)}
    assert spec_with(tmp_path, "{gtype: instance, may_be_leaked: {is_a: GstObject, offset: "
                     "52, mask: 0x10}}").class_sources() == {
        "GObject": ClassSource(instance=True, kept=KeptFlag("GstObject", 52, 16))}
    assert load_spec("gstreamer").class_sources() == {
        "GObject": ClassSource(instance=True, kept=KeptFlag("GstObject", 48, 1)),
        "GstMiniObject": ClassSource(offset=0)}
    assert load_spec("gobject").class_sources() == {"GObject": ClassSource(instance=True)}


@pytest.mark.parametrize("value, problem", [
    ("{gtype: 12}", "multiple of 8"), ("{gtype: klass}", "expected instance"),
    ("{offset: 0}", "gtype"), ("{gtype: 99999}", "out of range"),
    ("{gtype: instance, may_be_leaked: {is_a: GstObject, offset: 50, mask: 1}}",
     "multiple of 4"),
    ("{gtype: instance, may_be_leaked: {is_a: 'Gst Object', offset: 48, mask: 1}}",
     "a GType name"),
    ("{gtype: instance, may_be_leaked: {offset: 48, mask: 1}}", "is_a"),
    ("{gtype: instance, may_be_leaked: {is_a: GstObject, offset: 48, mask: 0}}",
     "out of range")])
def test_bad_class_keys_name_the_line(tmp_path, value, problem) -> None:
    with pytest.raises(ConfigError, match=problem) as err:
        spec_with(tmp_path, value)
    assert ":4" in str(err.value)


def obj(address: int, count: int = 1) -> LeakedObject:
    return LeakedObject(address, count, 0, 0, 1000)


def test_a_group_of_two_classes_is_split_and_keeps_its_key() -> None:
    group = LeakGroup("GObject", FRAMES, [obj(1), obj(2), obj(3), obj(4)])
    out = apply_classes([group], {1: "GTask", 2: "JsonParser", 3: "GTask"})
    assert [(g.class_name, [o.address for o in g.objects]) for g in out] == [
        ("GTask", [1, 3]), ("", [4]), ("JsonParser", [2])]
    assert {g.key() for g in out} == {group.key()}
    assert apply_classes([group], {}) == [group]  # nothing read: unchanged


def run_of(groups: list[LeakGroup]) -> RunResult:
    result = RunResult("run", "/bin/app", "g")
    result.processes.append(ProcessReport(7, "app", ["app"], "exited", "exit 0",
                                          groups=groups))
    return result


def test_outputs_show_the_class_and_findings_keep_the_type() -> None:
    groups = apply_classes([LeakGroup("GObject", FRAMES, [obj(1), obj(2), obj(3)])],
                           {1: "GTask", 2: "GTask", 3: "JsonParser"})
    result = run_of(groups)
    text = report.render_group(groups[0], "leaked")[0]
    assert "of type 'GObject' class 'GTask'" in text
    doc = reportjson.run_json(result)
    assert [g.get("class_name") for g in doc["processes"][0]["groups"]] == \
        ["GTask", "JsonParser"]
    again = runjson.run_from_json(doc)  # a saved run renders the same
    assert [g.class_name for g in again.processes[0].groups] == ["GTask", "JsonParser"]
    (finding,) = collect_findings(result)  # one finding: type and stack, as before
    assert finding.key[1] == "GObject"
    assert ciformats.title(finding) == "3 leaked GObject object(s) (classes GTask 2, " \
                                       "JsonParser 1)"
    assert "GTask" not in ciformats.case_name(finding)


class FakeObjects:
    def __init__(self, rows: list[tuple[int, int, int, int]]) -> None:
        self.rows = rows

    def live_of_types(self, type_ids, tgid=None):
        return [r for r in self.rows if r[2] in type_ids]


class FakeTracer:
    def __init__(self, rows: list[tuple[int, int, int, int]]) -> None:
        from types import SimpleNamespace
        self.plan = SimpleNamespace(spec=load_spec("gstreamer"))
        self.kernel = SimpleNamespace(objects=FakeObjects(rows))


def test_class_metric_reads_each_object_once_and_bounds_its_labels(monkeypatch) -> None:
    from refcntd.service import classmetrics
    from refcntd.session.tracer import type_id
    mini, gobj = type_id("GstMiniObject"), type_id("GObject")
    truth = {a: f"GstClass{a % 30}" for a in range(100, 400)} | {7: "GstPipeline"}
    asked: list[int] = []

    def read(pid, objects):
        asked.extend(objects)
        return ClassNames(names={a: truth[a] for a in objects if a in truth})
    monkeypatch.setattr(classmetrics, "read_classes", read)
    rows = [(1, a, mini, 5) for a in range(100, 400)] + [(1, 7, gobj, 5), (2, 8, gobj, 5)]
    counts = classmetrics.ClassCounts()
    first = counts.counts([FakeTracer(rows)])
    assert first[("GObject", "GstPipeline")] == 1 and first[("GObject", "_unread")] == 1
    minis = {c: n for (t, c), n in first.items() if t == "GstMiniObject"}
    assert len(minis) == classmetrics.MAX_CLASS_LABELS and minis["_other"] == 110
    assert sum(minis.values()) == 300
    assert len(asked) == 302
    asked.clear()
    again = counts.counts([FakeTracer(rows[51:] + [(1, 100, mini, 9)])])  # 100 made anew
    assert sorted(asked) == [8, 100]  # only the new life and the one not read before
    assert sum(n for (t, _), n in again.items() if t == "GstMiniObject") == 250
