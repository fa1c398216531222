"""The pprof profile of a run: what each sample, location, mapping and label holds,
read back with the protobuf library and with Go's own `go tool pprof`."""

from __future__ import annotations

import gzip
import re
import subprocess
from dataclasses import replace
from pathlib import Path

from test_cli_outputs import EVIL, RAW_CONTROL, evil_result
from test_columns import NOW, _columns

from refcntd.analysis.leaks import StackSource, group_columns
from refcntd.analysis.model import (
    HistoryStep,
    LeakedObject,
    LeakGroup,
    ProbeStatus,
    ProcessReport,
    RunResult,
    TracingStatus,
)
from refcntd.outputs import pprof
from refcntd.outputs.profileproto import message
from refcntd.symbolize.symbolizer import BuildIdIndex, Frame, Symbolizer
from refcntd.text import visible

STUB = Frame("/bin/x", 0x1000, "__refcnt__init", 0, "/src/refcnt.c", 11)


def result(tmp_path: Path) -> RunResult:
    exe = tmp_path / "prog"
    exe.write_bytes(Path("/bin/true").read_bytes())  # a real ELF with a build-id
    main = Frame(str(exe), 0x2000, "main", 8, "/src/main.c", 30)
    groups = [LeakGroup("map", (STUB, Frame(str(exe), 0x1500, "map__new", 4, "/src/m.c", 5),
                                main),
                        [LeakedObject(0x10, 10, 10, 1, 3_000_000),
                         LeakedObject(0x20, 1, 0, 0, 1_500_000)]),
              LeakGroup("dso", (STUB, Frame(str(exe), 0x1600, "dso__new", 2), main),
                        [LeakedObject(0x30, 2, 1, 0, 4_000_000,
                                      (HistoryStep("init", 1, (main,), 0),))]),
              LeakGroup("??", (Frame("", 0, raw="ip 0xdead"),), [LeakedObject(0x40, 1, 0, 0, 0)])]
    probes = [ProbeStatus("init", "__refcnt__init", str(exe), 0, "", "", True)]
    return RunResult("run", "perf-stubs", "prog",
                     [ProcessReport(42, "prog", ["prog"], "exited", "exit 0", 0, groups)],
                     TracingStatus(probes))


def decode(data: bytes):
    return message("Profile").FromString(gzip.decompress(data))


def test_samples_values_labels_and_symbols(tmp_path) -> None:
    p = decode(pprof.run_profile([result(tmp_path)]))
    s = list(p.string_table)
    assert s[0] == ""
    assert [(s[t.type], s[t.unit]) for t in p.sample_type] == list(pprof.SAMPLE_TYPES)
    assert (s[p.period_type.type], s[p.period_type.unit], p.period) == ("objects", "count", 1)
    assert s[p.default_sample_type] == "objects" and p.time_nanos == 0
    values = [list(x.value) for x in p.sample]
    # objects, references, age in ns
    assert values == [[2, 11, 4_500_000], [1, 2, 4_000_000], [1, 1, 0]]
    labels = [{s[label.key]: s[label.str] for label in x.label} for x in p.sample]
    assert labels[0] == {"target": "prog", "process": "prog", "type": "map", "state": "exited"}
    functions = {f.id: s[f.name] for f in p.function}
    locations = {loc.id: loc for loc in p.location}
    leaf = [functions[locations[x.location_id[0]].line[0].function_id] for x in p.sample[:2]]
    assert leaf == ["map__new", "dso__new"]  # the probed stub is not the leaf
    assert "__refcnt__init" not in functions.values()
    (m,) = p.mapping
    exe = str(tmp_path / "prog")
    assert s[m.filename] == exe and m.has_functions and m.has_line_numbers
    assert re.fullmatch(r"[0-9a-f]{40}", s[m.build_id])
    unresolved = locations[p.sample[2].location_id[0]]
    assert unresolved.mapping_id == 0 and functions[unresolved.line[0].function_id] == \
        "?? ip 0xdead"
    assert locations[p.sample[0].location_id[0]].address == 0x1500
    assert m.memory_start <= 0x2000 < m.memory_limit


def test_same_run_same_bytes_and_type_filter(tmp_path) -> None:
    r = result(tmp_path)
    assert pprof.run_profile([r]) == pprof.run_profile([r])
    only = decode(pprof.run_profile([r], types=frozenset({"dso"})))
    assert [list(x.value) for x in only.sample] == [[1, 2, 4_000_000]]
    live = decode(pprof.run_profile([r], time_ns=123, live=True))
    assert live.time_nanos == 123
    assert "state" not in set(live.string_table)


def test_columns_summed_without_objects_others_in_chunks(monkeypatch) -> None:
    objs = _columns(3000)
    groups = group_columns(objs, StackSource(lambda _i: None), Symbolizer(BuildIdIndex()), NOW)
    assert len(groups) > 1 and len(groups[0].objects) < 3000  # a group of some rows only
    monkeypatch.setattr(pprof, "_CHUNK", 7)
    for g in groups:
        listed = list(g.objects)
        expected = (len(listed), sum(o.count for o in listed),
                    sum(o.age_ns for o in listed))
        assert pprof.group_values(g) == expected  # LeakedObjects.sums()
        g.objects = tuple(listed)  # type: ignore[assignment]
        assert pprof.group_values(g) == expected  # a chunk at a time


def test_ages_under_a_millisecond_are_not_summed_to_zero(tmp_path) -> None:
    """Objects a test leaks are 0.08-0.15 ms old: whole milliseconds summed them to a
    profile whose -sample_index=age total was 0 (issue 41)."""
    r = result(tmp_path)
    for g, ages in zip(r.processes[0].groups, ((80_000, 150_000), (120_000,), (0,)),
                       strict=True):
        g.objects = [replace(o, age_ns=a) for o, a in zip(g.objects, ages, strict=True)]
    p = decode(pprof.run_profile([r]))
    assert [x.value[2] for x in p.sample] == [230_000, 120_000, 0]


def test_hostile_names_escaped_and_read_by_go_pprof(tmp_path) -> None:
    path = tmp_path / "evil.pb.gz"
    path.write_bytes(pprof.run_profile([evil_result(tmp_path)]))
    p = decode(path.read_bytes())
    assert not any(RAW_CONTROL.search(text) for text in p.string_table)
    assert visible(EVIL) in p.string_table  # the text report's escaping
    raw = subprocess.run(["go", "tool", "pprof", "-raw", str(path)], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert "type:[obj\\x1b[31m\\x01\\x0a::error::x\\x7f]" in raw, raw
    assert not RAW_CONTROL.search(raw.replace("\n", "").replace("\t", ""))


def test_surrogates_in_names_do_not_break_encoding(tmp_path) -> None:
    r = result(tmp_path)
    r.processes[0].groups[0].type_name = "bad\udcff"
    p = decode(pprof.run_profile([r]))
    assert "bad\\udcff" in p.string_table


def test_write_bytes_refuses_a_terminal(monkeypatch) -> None:
    import pytest

    from refcntd.errors import UsageError
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    with pytest.raises(UsageError, match="binary"):
        pprof.write_bytes(b"x", None)
