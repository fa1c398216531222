"""GET /leaks and `refcntd checkpoint --scan` on `serve`: a process that never exits
is stopped briefly, scanned, continued; the objects lost now are exactly the
fixture's lost ones (valgrind's truth for tests/fixtures/reach.c at exit, which the
scan tests check), and nothing still reachable."""

from __future__ import annotations

import json
import time
import urllib.request

from conftest import EXAMPLES, FIXTURES, cc, refcntd, start_hanging
from reachtruth import fixture_objects
from test_serve import Serve, target_yaml

from refcntd.service.leakscan import soft_dirty

LOST = {"arena_lost", "big_lost", "cycle_a", "cycle_b", "lost_owner", "owned", "plain_lost",
        "stale_lost"}


def hanging(exe):
    proc, printed = start_hanging(exe)
    return proc, fixture_objects(printed)


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_leaks_lists_what_is_lost_now(bpf, tmp_path):
    exe = cc(tmp_path / "reach", [FIXTURES / "reach.c", EXAMPLES / "refcnt.c"],
             ["-O2", "-fomit-frame-pointer", "-pthread"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        url = f"http://127.0.0.1:{serve.port}"
        proc, objects = hanging(exe)
        try:
            time.sleep(0.5)
            with urllib.request.urlopen(f"{url}/leaks", timeout=60) as r:
                answer = json.loads(r.read())
            text = refcntd(["checkpoint", "--url", url, "--scan"])
            with urllib.request.urlopen(f"{url}/leaks?budget_ms=0.001", timeout=60) as r:
                refused = json.loads(r.read())
            running = state(proc.pid)
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    target = answer["targets"]["svc"]
    (scan,) = target["scans"]
    assert scan["pid"] == proc.pid and not scan["skipped"] and scan["stopped_s"] < 5
    # issue 57: copied in the stop, scanned once continued (soft-dirty: the pages written
    # since a copy made while it ran)
    assert scan["how"] == ("soft-dirty" if soft_dirty() else "copy"), scan
    assert scan["copied_bytes"] > 0 and not scan["why"]
    (process,) = target["run"]["processes"]
    found = {int(i["address"], 16): (g["kind"], i) for g in process["groups"]
             for i in g["instances"]}
    assert {objects[a][0] for a in found} == LOST, found
    assert {k for k, _ in found.values()} == {"definitely lost", "indirectly lost"}
    assert text.returncode == 0, text.stderr
    assert "8 object(s) definitely or indirectly lost now" in text.stdout, text.stdout
    assert "(definitely lost) 1 object of type 'plain_lost'" in text.stdout
    (skip,) = refused["targets"]["svc"]["scans"]
    assert skip["skipped"].startswith("scan not started:") and "over the budget" in \
        skip["skipped"]
    assert running in ("S", "R")  # continued, and never stopped by the refused scan
