"""GET /debug/pprof/refcount and GET /report.html over fake tracers: the query
parameters, the answers' types, and totals equal to the live objects."""

from __future__ import annotations

import gzip
import threading
from types import SimpleNamespace

from refcntd.analysis.leaks import StackSource
from refcntd.kernel import abi
from refcntd.kernel.columns import ColumnBuilder, live_sites
from refcntd.outputs.profileproto import message
from refcntd.service.checkpoint import Views
from refcntd.service.liveviews import routes
from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer

PID = 4_000_001  # no such process: no command line to read


def fake_tracer(objects: list[tuple[str, int]]) -> SimpleNamespace:
    """The kernel's object map as live_sites reads it: a batch of rows of columns."""
    type_ids = {name: i + 1 for i, name in enumerate(sorted({n for n, _ in objects}))}
    n = len(objects)
    keys, values = (abi.ObjKey * n)(), (abi.ObjVal * n)()
    for i, (name, count) in enumerate(objects):
        keys[i].tgid, keys[i].addr = PID, 0x1000 + 16 * i
        values[i].count, values[i].gets, values[i].gen = count, count, 1
        values[i].type_id = type_ids[name]
    builder = ColumnBuilder(abi.ObjKey, abi.ObjVal, ("tgid", "addr"))
    builder.add(keys, values, n, None)
    names = {i: name for name, i in type_ids.items()}
    plan = SimpleNamespace(spec=SimpleNamespace(name="perf-stubs"), sites=[], decisions=[])
    tracker = SimpleNamespace(stacks=StackSource(lambda _i: None),
                              sym=Symbolizer(BuildIdIndex()), sessions={})
    return SimpleNamespace(plan=plan, tracker=tracker,
                           worker=SimpleNamespace(call=lambda fn: fn()),
                           kernel=SimpleNamespace(
                               objects=SimpleNamespace(live_sites=lambda now, shown: live_sites(
                               builder.columns, names, now, shown))))


def views() -> Views:
    tracers = {"svc": [fake_tracer([("conn", 1), ("conn", 3), ("sess", 2)])],
               "other": [fake_tracer([("conn", 5)])]}
    return Views(lambda: tracers, threading.RLock())


def values(body: bytes) -> dict[str, list[int]]:
    p = message("Profile").FromString(gzip.decompress(body))
    s = p.string_table
    out: dict[str, list[int]] = {}
    for sample in p.sample:
        labels = {s[label.key]: s[label.str] for label in sample.label}
        key = f"{labels['target']}/{labels['type']}"
        out[key] = [a + b for a, b in zip(out.get(key, [0, 0, 0]), sample.value, strict=True)]
    return {k: v[:2] for k, v in out.items()}


def test_profile_of_every_target_then_picked_by_target_and_type() -> None:
    route = routes(views())["/debug/pprof/refcount"]
    status, ctype, body = route("GET", "")
    assert (status, ctype) == ("200 OK", "application/octet-stream")
    assert values(body) == {"svc/conn": [2, 4], "svc/sess": [1, 2], "other/conn": [1, 5]}
    assert values(route("GET", "target=svc")[2]) == {"svc/conn": [2, 4], "svc/sess": [1, 2]}
    assert values(route("GET", "type=conn&seconds=14")[2]) == {"svc/conn": [2, 4],
                                                              "other/conn": [1, 5]}
    assert values(route("GET", "type=sess&type=conn&target=other")[2]) == \
        {"other/conn": [1, 5]}
    status, _, body = route("GET", "type=nothing")
    assert status == "200 OK" and values(body) == {}  # an empty profile, still a profile
    assert gzip.decompress(body)  # Alloy refuses an empty body


def test_refusals() -> None:
    route = routes(views())["/debug/pprof/refcount"]
    for query, needle in (("typ=conn", "unknown query parameter 'typ'"),
                          ("target=nope", "no target 'nope' (targets: other, svc)"),
                          ("type", "bad query string")):
        status, _, body = route("GET", query)
        assert status == "400 Bad Request" and needle in body.decode(), (query, body)
    assert route("POST", "")[0] == "405 Method Not Allowed"


def test_report_page() -> None:
    status, ctype, body = routes(views())["/report.html"]("GET", "target=svc")
    page = body.decode()
    assert (status, ctype) == ("200 OK", "text/html; charset=utf-8")
    assert "refcntd: live objects of svc" in page and "[sess]" in page and "other" not in page


def test_every_object_counted_the_first_ones_listed() -> None:
    many = Views(lambda: {"svc": [fake_tracer([("conn", 2)] * 120)]}, threading.RLock())
    r = routes(many)
    assert values(r["/debug/pprof/refcount"]("GET", "")[2]) == {"svc/conn": [120, 240]}
    page = r["/report.html"]("GET", "")[2].decode()
    assert "Live 120 object(s) of type <code>conn</code></b>, 240 reference(s)" in page
    assert page.count("<tr><td><code>0x") == 50 and "... and 70 more objects" in page
