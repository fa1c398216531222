"""The fast paths of pprof give what the per-object ones gave, on real traced programs:
a saved run read as columns (outputs/savedcolumns.py) against the same file read
object by object, and serve's live objects counted per site by numpy
(kernel.columns.live_sites) against one record per object (live_objects).

Runs use --no-leak-kinds: the subject here is saved runs rendered as profiles, and the
fixtures keep what they leak in globals (sinks for the optimizer), which the default
lists as still reachable, not failing.
"""

from __future__ import annotations

import gzip
import json
import logging
import subprocess
import time
from pathlib import Path

from conftest import FIXTURES, REFCNTD, ROOT, refcntd
from test_checkpoint import Requests
from test_run import PERFLIKE_LEAKS

from refcntd.inputs.files import REPORT_LIMIT, read_text
from refcntd.outputs import runjson
from refcntd.outputs.formats import RENDERERS
from refcntd.outputs.policy import Policy
from refcntd.outputs.pprof import run_profile
from refcntd.outputs.profileproto import message
from refcntd.outputs.savedcolumns import SavedObjects

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

REQUESTS = (1500, 700)  # leaked 'conn' objects of two processes of one target


def _samples(profile: bytes) -> dict[tuple[str, ...], list[int]]:
    p = message("Profile").FromString(gzip.decompress(profile))
    s = p.string_table
    out: dict[tuple[str, ...], list[int]] = {}
    for sample in p.sample:
        key = (*(s[p.function[p.location[i - 1].line[0].function_id - 1].name]
                 for i in sample.location_id if p.location[i - 1].line),
               *sorted(f"{s[la.key]}={s[la.str]}" for la in sample.label))
        out[key] = [a + b for a, b in zip(out.get(key, [0, 0, 0]), sample.value, strict=True)]
    return out


def _run(cmd: list[str], saved: Path, feed: str = "") -> dict:
    proc = subprocess.run([*REFCNTD, *RUN, "--json", str(saved), "--", *cmd], input=feed,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 23, proc.stderr
    return json.loads(saved.read_text())


def test_saved_run_as_columns_renders_like_objects(bpf, build, tmp_path):
    """requests.c: 2 200 leaked 'conn' objects; perflike: three types at six sites."""
    requests = build.program("requests", [FIXTURES / "requests.c"])
    runs = [(_run([str(requests)], tmp_path / "requests.json",
                  "".join(f"{n}\n" for n in REQUESTS)), {"conn": sum(REQUESTS)}, "obj_new"),
            (_run([str(build.perflike("O2fp"))], tmp_path / "perflike.json"),
             {t: len(c) for t, c in PERFLIKE_LEAKS.items()}, None)]
    for (report, leaked, allocator), name in zip(runs, ("requests", "perflike"), strict=True):
        saved = tmp_path / f"{name}.json"
        fast = runjson.load_run(str(saved))
        slow = runjson._parse(str(saved), "saved report",
                              read_text(str(saved), "x", REPORT_LIMIT), lambda _items: None)
        assert all(isinstance(g.objects, SavedObjects) for p in fast.processes
                   for g in p.groups)
        assert not any(isinstance(g.objects, SavedObjects) for p in slow.processes
                       for g in p.groups)
        profile = run_profile([fast])
        assert profile == run_profile([slow])
        samples = _samples(profile)
        by_type: dict[str, int] = {}
        for key, values in samples.items():
            kind = next(label[5:] for label in key if label.startswith("type="))
            by_type[kind] = by_type.get(kind, 0) + values[0]
        assert by_type == leaked == {t: sum(len(g["instances"]) for p in report["processes"]
                                            for g in p["groups"] if g["type"] == t)
                                     for t in leaked}
        references = sum(i["count"] for p in report["processes"] for g in p["groups"]
                         for i in g["instances"])
        assert sum(v[1] for v in samples.values()) == references
        if allocator:
            assert all(key[0] == allocator for key in samples), samples
        verdict = Policy.build(None, [], []).evaluate(fast)
        for fmt, render in RENDERERS.items():
            assert render(fast, verdict, Path(".")) == render(slow, verdict, Path(".")), fmt
        again = tmp_path / f"{name}.pb.gz"
        out = refcntd(["report", "--format", "pprof", "--output", str(again), str(saved)])
        assert out.returncode == 23 and again.read_bytes() == profile, out.stderr


def test_live_sites_count_like_records(bpf, build, tmp_path):
    from refcntd.inputs.config import load_config
    from refcntd.kernel import setup
    from refcntd.service.daemon import Daemon
    from refcntd.service.liveviews import MAX_SHOWN, routes
    exe = build.program("requests", [FIXTURES / "requests.c"])
    config = tmp_path / "refcntd.yaml"
    config.write_text(f"version: 1\nlisten: 127.0.0.1:1\nreport_dir: {tmp_path}/reports\n"
                      f"targets:\n  - name: svc\n    path: {exe}\n    spec: perf-stubs\n")
    setup.prepare()
    logging.disable(logging.INFO)
    daemon = Daemon(load_config(str(config)))
    apps: list[Requests] = []
    try:
        daemon.attach_all()
        for n in REQUESTS:
            apps.append(Requests(exe))
            apps[-1].handle(n)
        time.sleep(0.2)
        (tracer,) = daemon.views.tracers()["svc"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        sites = tracer.worker.call(lambda: tracer.kernel.objects.live_sites(now, MAX_SHOWN))
        records = tracer.worker.call(tracer.kernel.objects.live_objects)
        body = routes(daemon.views)["/debug/pprof/refcount"]("GET", "")[2]
    finally:
        for app in apps:
            app.kill()
        daemon.shutdown()
        logging.disable(logging.NOTSET)
    expected: dict[tuple[object, ...], list[object]] = {}
    for r in records:  # the per-record count the live views did before
        site = expected.setdefault((r.tgid, r.type_name, r.name_ptr, r.stack_id, r.caller_ip),
                                   [0, 0, 0, []])
        site[0], site[1], site[2] = site[0] + 1, site[1] + r.count, \
            site[2] + max(0, now - r.init_ns)
        if len(site[3]) < MAX_SHOWN:
            site[3].append(r)
    got = {(s.tgid, s.type_name, s.name_ptr, s.stack_id, s.caller_ip):
           [s.objects, s.references, s.age_ns, list(s.shown)] for s in sites}
    assert got == expected
    assert sorted(v[0] for v in got.values()) == sorted(REQUESTS)  # one site per process
    assert {key[0] for key in got} == {app.proc.pid for app in apps}
    samples = _samples(body)
    assert sum(v[0] for v in samples.values()) == sum(REQUESTS), samples
    assert all(key[0] == "obj_new" and "type=conn" in key for key in samples), samples
