"""Objects drained as columns are grouped and reported exactly like ObjectRecords
(the path used for processes without history; the record path is the reference)."""

from __future__ import annotations

import json
import random

from refcntd.analysis.leaks import StackSource, group_columns, group_leaks
from refcntd.kernel import abi, decode
from refcntd.kernel.columns import ColumnBuilder
from refcntd.outputs import report, reportjson
from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer

NOW = 10**12


def _columns(n: int, tgid: int = 7):
    rng = random.Random(n)
    keys, values = (abi.ObjKey * n)(), (abi.ObjVal * n)()
    for i in range(n):
        keys[i].tgid, keys[i].addr = tgid if i % 5 else tgid + 1, rng.getrandbits(47) << 4
        v = values[i]
        v.count, v.gets, v.puts, v.gen = rng.randint(-2, 9), rng.randint(0, 99), i % 7, 3
        v.type_id, v.stack_id = (i % 3) + 1, 0
        v.init_ns, v.caller_ip = rng.randint(0, NOW), (i % 2) * 0x401000
    builder = ColumnBuilder(abi.ObjKey, abi.ObjVal)
    builder.add(keys, values, n, [i for i in range(n) if keys[i].tgid == tgid])
    builder.add(keys, values, n // 2, None)  # a second batch, taken whole
    from refcntd.kernel.columns import ObjectColumns
    return ObjectColumns(tgid, builder.columns, {1: "dso", 2: "map"})  # 3: unnamed


def test_columns_report_like_records() -> None:
    objs = _columns(500)
    stacks = StackSource(lambda _i: None)
    sym = Symbolizer(BuildIdIndex())
    fast = group_columns(objs, stacks, sym, NOW)
    slow = group_leaks(list(objs), stacks, sym, NOW)
    assert [(g.type_name, g.frames, len(g.objects)) for g in fast] == \
        [(g.type_name, g.frames, len(g.objects)) for g in slow]
    for f, s in zip(fast, slow, strict=True):
        assert f.objects[:8] == s.objects[:8]  # the text report's few, without a full sort
        assert list(f.objects) == s.objects
        assert f.objects.counts() == sorted({o.count for o in s.objects})
    assert [report.render_group(g, "leaked") for g in fast] == \
        [report.render_group(g, "leaked") for g in slow]
    assert {(r.stack_id, r.caller_ip) for r in objs.stack_refs()} == {(0, 0), (0, 0x401000)}
    assert len(objs.stack_refs()) == 2


def test_columns_stream_the_same_json(tmp_path) -> None:
    from refcntd.analysis.model import ProcessReport, RunResult
    objs = _columns(300)
    stacks = StackSource(lambda _i: None)
    sym = Symbolizer(BuildIdIndex())
    docs = []
    for groups in (group_columns(objs, stacks, sym, NOW), group_leaks(list(objs), stacks,
                                                                        sym, NOW)):
        result = RunResult("run", "s", "x", [ProcessReport(7, "x", [], "exited", "", 0, groups)])
        path = tmp_path / "r.json"
        reportjson.write_json(result, str(path))
        docs.append(json.loads(path.read_text()))
    assert docs[0] == docs[1]


def test_a_process_report_reads_only_the_objects_it_shows(tmp_path, monkeypatch) -> None:
    """The text report shows a few objects of each group and the JSON streams them as
    columns: neither builds an object per row (ownership needs --history; 1M objects
    took 8 s when the ownership view walked every object four times)."""
    from refcntd.analysis import leaks
    from refcntd.analysis.model import ProcessReport, RunResult
    made = []
    real = leaks.LeakedObjects._object
    monkeypatch.setattr(leaks.LeakedObjects, "_object",
                        lambda self, r: made.append(r) or real(self, r))
    objs = _columns(3000)
    groups = group_columns(objs, StackSource(lambda _i: None), Symbolizer(BuildIdIndex()), NOW)
    process = ProcessReport(7, "x", [], "exited", "", 0, groups)
    report.render_process(process)
    reportjson.write_json(RunResult("run", "s", "x", [process]), str(tmp_path / "r.json"))
    assert sum(len(g.objects) for g in groups) > 2000
    assert 0 < len(made) <= 64 * len(groups), len(made)


def _live(records, now_ns: int, shown: int):
    """The per-record count that live_sites replaced (liveviews before numpy)."""
    sites: dict[tuple[object, ...], list[object]] = {}
    for r in records:
        site = sites.setdefault((r.tgid, r.type_name, r.name_ptr, r.stack_id, r.caller_ip),
                                [0, 0, 0, []])
        site[0] += 1
        site[1] += r.count
        site[2] += max(0, now_ns - r.init_ns)
        if len(site[3]) < shown:
            site[3].append(r)
    return {k: (v[0], v[1], v[2], tuple(v[3])) for k, v in sites.items()}


def test_live_sites_count_like_records() -> None:
    """Every object counted per (process, type name, stack), sums exact past 2**63 (old
    objects), ages of objects newer than `now` 0, and the first `shown` in map order."""
    from refcntd.kernel.columns import live_sites
    rng = random.Random(5)
    n, now = 4000, 2**62
    keys, values = (abi.ObjKey * n)(), (abi.ObjVal * n)()
    for i in range(n):
        keys[i].tgid, keys[i].addr = 100 + i % 3, rng.getrandbits(47) << 4
        v = values[i]
        v.count, v.gets, v.puts, v.gen = rng.randint(-3, 2**40), i % 5, i % 7, i % 2
        v.type_id = rng.choice([0, 1, 2, 3, 9])  # 3 is named like 1; 9 has no name
        v.stack_id, v.caller_ip = rng.choice([0, 5, 6]), rng.choice([0, 0x401000])
        v.name_ptr = rng.choice([0, 0x7000])
        v.init_ns = rng.choice([0, 1, now - 10**6, now + 5, rng.randint(0, now)])
    names = {1: "dso", 2: "map", 3: "dso"}
    builder = ColumnBuilder(abi.ObjKey, abi.ObjVal, ("tgid", "addr"))
    builder.add(keys, values, n, None)
    expected = _live([decode.decode_object(keys[i], values[i], names) for i in range(n)],
                     now, 7)
    got = {(s.tgid, s.type_name, s.name_ptr, s.stack_id, s.caller_ip):
           (s.objects, s.references, s.age_ns, s.shown) for s in live_sites(
               builder.columns, names, now, 7)}
    assert got == expected
    assert max(v[2] for v in got.values()) > 2**63  # the sums that int64 would overflow
    assert live_sites(ColumnBuilder(abi.ObjKey, abi.ObjVal, ("tgid", "addr")).columns,
                      names, now, 7) == []
