"""Every kernel counter bpf/refcntd.h declares reaches the report and /metrics.

Each counter of `enum refcntd_stat` is written into the live maps of a running
`refcntd serve`: the totals, and the traced process's own counters (other
tests provoke the ones that are cheap to provoke for real: map full, stack
store full, ring buffer full, unknown gets, cut stacks...); then a traced
process exits.  Its report must carry every
"loss:" counter in its loss table and every "note:" counter in its notes,
with its own value, and a scrape must show each total under its own name.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import FIXTURES
from test_serve import Serve, metric, target_yaml

from refcntd.kernel.abi import STAT_TEXT, Stat


def map_ids(pid: int) -> dict[str, int]:
    """The ids of the BPF maps the process holds open, by name (from its fds' fdinfo)."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            text = info.read_text()
        except FileNotFoundError:  # an fd the daemon closed meanwhile
            continue
        for line in text.splitlines():
            if line.startswith("map_id:"):
                ids.add(int(line.split()[1]))
    return {bpftool("map", "show", "id", str(i))["name"]: i for i in ids}


def bpftool(*args: str) -> dict:
    out = subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def update(map_id: int, key: bytes, value: int) -> None:
    subprocess.run(["bpftool", "map", "update", "id", str(map_id), "key",
                    *[str(b) for b in key], "value",
                    *[str(b) for b in value.to_bytes(8, "little")]], check=True)


def write_stat(maps: dict[str, int], pid: int, stat: Stat, value: int) -> int:
    """Set the counter in the totals (on every CPU: returns the sum refcntd will read)
    and, to `value`, in the counters of process `pid` (what its report shows)."""
    key = stat.value.to_bytes(4, "little")
    update(maps["stats"], key, value)
    update(maps["proc_stats"], pid.to_bytes(4, "little") + key, value)
    entry = bpftool("map", "lookup", "id", str(maps["stats"]), "key", *map(str, key))
    return sum(int(v["value"]) for v in entry["formatted"]["values"])


def test_every_kernel_counter_is_in_the_report_and_the_metrics(bpf, build, tmp_path):
    exe = build.program("waiter", [FIXTURES / "waiter.c"], "O2")
    assert len(STAT_TEXT) == len(Stat) >= 27  # every counter has its one text
    with Serve(tmp_path, target_yaml("waiter", exe)) as serve:
        proc = subprocess.Popen([str(exe), "hold"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"ready\n"
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"holding\n"  # its refcount work is done
            maps = map_ids(serve.proc.pid)
            own = {stat: 1000 + 7 * stat.value for stat in Stat}
            total = {stat: write_stat(maps, proc.pid, stat, n) for stat, n in own.items()}
        finally:  # never left holding (pause()) when the test fails
            proc.terminate()
            proc.wait(10)
        serve.wait_log(f"target=waiter pid={proc.pid} ", 60)
        samples = serve.scrape()
        assert serve.stop() == 0
    (report,) = serve.reports.glob("*.json")
    tracing = json.loads(report.read_text())["tracing"]
    assert not tracing["complete"]
    for stat, n in own.items():
        assert total[stat] >= n
        kind, text = STAT_TEXT[stat].split(": ", 1)
        if kind == "loss":
            assert tracing["lost"].get(text) == n, (stat, tracing["lost"])
            assert metric(samples, "refcntd_dropped_records_total", target="waiter",
                          reason=stat.name.lower()) == total[stat], stat
        else:
            assert f"{n} {text}" in tracing["notes"], (stat, tracing["notes"])
            assert metric(samples, "refcntd_kernel_notes_total", target="waiter",
                          note=stat.name.lower()) == total[stat], stat


def test_each_process_report_has_its_own_losses(bpf, build, tmp_path, monkeypatch):
    """A process that overflows the ring buffer gets the loss in its report; a process
    traced after it by the same daemon does not (its report is complete)."""
    exe = build.program("capture", [FIXTURES / "capture.c"], "O2")
    monkeypatch.setenv("REFCNTD_RINGBUF_PAGES", "1")  # 4 KiB: a burst of puts overflows it
    with Serve(tmp_path, target_yaml("capture", exe)) as serve:
        burst = subprocess.Popen([str(exe), "0", "3000", "0"])
        burst.wait(30)
        serve.wait_log(f"target=capture pid={burst.pid} ", 60)
        clean = subprocess.Popen([str(exe), "0", "0"])
        clean.wait(30)
        serve.wait_log(f"target=capture pid={clean.pid} ", 60)
        samples = serve.scrape()
        assert serve.stop() == 0
    tracing = {}
    for path in serve.reports.glob("*.json"):
        data = json.loads(path.read_text())
        tracing[data["processes"][0]["pid"]] = data["tracing"]
    lost = tracing[burst.pid]["lost"]
    event_lost = lost.get("lifecycle events lost: ring buffer full", 0)
    assert event_lost > 0 and not tracing[burst.pid]["complete"], tracing[burst.pid]
    assert tracing[clean.pid]["lost"] == {} and tracing[clean.pid]["complete"], tracing
    assert all(t["lost"] == {} for pid, t in tracing.items() if pid != burst.pid), tracing
    # the total also has the lifecycle events of other processes lost in the same burst
    assert metric(samples, "refcntd_dropped_records_total", target="capture",
                  reason="event_lost") >= event_lost
