"""Every kernel counter bpf/refcntd.h declares reaches the report and /metrics.

Each counter of `enum refcntd_stat` is written into the live `stats` map of a
running `refcntd serve` (other tests provoke the ones that are cheap to
provoke for real: map full, stack store full, ring buffer full, unknown gets,
cut stacks...); then a traced process exits.  Its report must carry every
"loss:" counter in its loss table and every "note:" counter in its notes,
with the map's value, and a scrape must show each one under its own name.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import FIXTURES
from test_serve import Serve, metric, target_yaml

from refcntd.kernel.abi import STAT_TEXT, Stat


def stats_map_id(pid: int) -> int:
    """The id of the `stats` map the process holds open (from its fds' fdinfo)."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        for line in info.read_text().splitlines():
            if line.startswith("map_id:"):
                ids.add(int(line.split()[1]))
    named = [i for i in ids if bpftool("map", "show", "id", str(i))["name"] == "stats"]
    assert len(named) == 1, named
    return named[0]


def bpftool(*args: str) -> dict:
    out = subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def write_stat(map_id: int, stat: Stat, value: int) -> int:
    """Set the counter on every CPU; returns the sum refcntd will read."""
    key = [str(b) for b in stat.value.to_bytes(4, "little")]
    subprocess.run(["bpftool", "map", "update", "id", str(map_id), "key", *key, "value",
                    *[str(b) for b in value.to_bytes(8, "little")]], check=True)
    entry = bpftool("map", "lookup", "id", str(map_id), "key", *key)
    return sum(int(v["value"]) for v in entry["formatted"]["values"])


def test_every_kernel_counter_is_in_the_report_and_the_metrics(bpf, build, tmp_path):
    exe = build.program("waiter", [FIXTURES / "waiter.c"], "O2")
    assert len(STAT_TEXT) == len(Stat) >= 27  # every counter has its one text
    with Serve(tmp_path, target_yaml("waiter", exe)) as serve:
        proc = subprocess.Popen([str(exe), "hold"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\n"
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"holding\n"  # its refcount work is done
        map_id = stats_map_id(serve.proc.pid)
        expected = {stat: write_stat(map_id, stat, 1000 + 7 * stat.value) for stat in Stat}
        proc.terminate()
        proc.wait(10)
        serve.wait_log(f"target=waiter pid={proc.pid} ", 60)
        samples = serve.scrape()
        assert serve.stop() == 0
    (report,) = serve.reports.glob("*.json")
    tracing = json.loads(report.read_text())["tracing"]
    assert not tracing["complete"]
    for stat, n in expected.items():
        assert n >= 1000
        kind, text = STAT_TEXT[stat].split(": ", 1)
        if kind == "loss":
            assert tracing["lost"].get(text) == n, (stat, tracing["lost"])
            assert metric(samples, "refcntd_dropped_records_total", target="waiter",
                          reason=stat.name.lower()) == n, stat
        else:
            assert f"{n} {text}" in tracing["notes"], (stat, tracing["notes"])
            assert metric(samples, "refcntd_kernel_notes_total", target="waiter",
                          note=stat.name.lower()) == n, stat
