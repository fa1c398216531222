"""Checkpoint/diff on a program that never exits: exactly the leaked site and count."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

from conftest import FIXTURES, functions, leak_summary, refcntd
from test_attach import Attached
from test_serve import Serve, free_port, metric, target_yaml


class Requests:
    """tests/fixtures/requests.c: each request leaks one 'conn' and frees the rest."""

    def __init__(self, exe) -> None:
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def handle(self, n: int | str) -> None:
        """One stdin line (a count, or bufsvc.c's "N drop")."""
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def end(self) -> None:
        """Its stdin closed: it exits through exit() (a killed process is not judged)."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            self.kill()


def test_diff_shows_exactly_what_grew_since_the_checkpoint(bpf, build, tmp_path):
    exe = build.program("requests", [FIXTURES / "requests.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        url = f"http://127.0.0.1:{serve.port}"
        app = Requests(exe)
        try:
            app.handle(5)  # before the checkpoint: not part of the diff
            mark = refcntd(["checkpoint", "--url", url])
            assert mark.returncode == 0 and "checkpoint set" in mark.stdout, mark.stderr
            app.handle(7)
            time.sleep(0.2)
            out = refcntd(["diff", "--url", url, "--json"])
            text = refcntd(["diff", "--url", url])
            with urllib.request.urlopen(f"{url}/live", timeout=30) as r:
                live = json.loads(r.read())
            with urllib.request.urlopen(f"{url}/diff?format=folded", timeout=30) as r:
                folded = r.read().decode()
            serve.proc.send_signal(signal.SIGUSR2)  # the same, written as a report file
            serve.wait_log("diff since the checkpoint written")
        finally:
            app.kill()
        assert serve.stop() == 0
    assert out.returncode == 0, out.stderr
    processes = json.loads(out.stdout)["targets"]["svc"]
    assert [p["pid"] for p in processes] == [app.proc.pid]
    groups = processes[0]["groups"]
    # counted in the kernel per allocation site: 7 since the checkpoint, 12 live in all
    # (the first ones under the name's pointer: its page was not present yet); the
    # sessions, all released, are nowhere
    assert [(g["type"], g["objects"], g["live"], g["created"]) for g in groups] == \
        [("conn", 7, 12, 12)]
    assert 0.2e9 <= groups[0]["mean_age_ns"] < 60e9
    assert functions(groups[0])[:4] == ["__refcnt__init", "obj_new", "handle_request", "main"]
    assert "target svc:" in text.stdout and "7 objects of type 'conn'" in text.stdout, \
        text.stdout
    assert json.loads(out.stdout)["not_counted"] == {"svc": 0}
    (lp,) = live["targets"]["svc"]
    assert [(g["type"], g["objects"]) for g in lp["groups"]] == [("conn", 12)]
    (line,) = folded.splitlines()
    assert line.startswith("requests;") and line.endswith(
        "main;handle_request;obj_new;__refcnt__init;[conn] 7"), line
    written = [p for p in serve.reports.glob("*-diff-*.json")]
    assert len(written) == 1
    assert json.loads(written[0].read_text())["targets"]["svc"][0]["groups"][0]["objects"] == 7



def test_attach_answers_checkpoint_and_diff_and_signals(bpf, build, tmp_path):
    """A developer's long attach: the same routes with --listen, and SIGUSR1/SIGUSR2."""
    exe = build.program("requests", [FIXTURES / "requests.c"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with Attached(["--binary", str(exe), "--listen", f"127.0.0.1:{port}",
                   "--web-enable-checkpoint"],
                  tmp_path / "attach.json") as attached:
        app = Requests(exe)
        try:
            app.handle(3)
            assert "no checkpoint yet" in refcntd(["diff", "--url", url]).stdout
            mark = refcntd(["checkpoint", "--url", url])
            assert mark.returncode == 0, mark.stderr
            app.handle(4)
            out = refcntd(["diff", "--url", url, "--json"])
            attached.proc.send_signal(signal.SIGUSR1)  # a new checkpoint: nothing since
            attached._wait_for("checkpoint set", 30)
            app.handle(2)
            attached.proc.send_signal(signal.SIGUSR2)  # the diff on attach's stdout
            time.sleep(1.0)
        finally:
            app.kill()
        code, stdout, report = attached.stop()
    assert out.returncode == 0, out.stderr
    (process,) = json.loads(out.stdout)["targets"]["requests"]
    assert [(g["type"], g["objects"], g["live"]) for g in process["groups"]] == \
        [("conn", 4, 7)]
    assert "2 objects of type 'conn' created since the checkpoint" in stdout, stdout
    # the killed app's objects are still reported at its exit, all 9 conns
    (exited,) = report["processes"]
    assert leak_summary(exited) == {"conn": [1] * 9}
    assert code in (0, 23), code


def test_ages_and_counts_come_from_the_kernel_aggregates(bpf, build, tmp_path):
    """The scrape reads per-site and per-creation-time counts: exact live counts, ages
    to about a second, and a handful of map entries for 20 000 live objects.  The
    age bounds are taken from the clock around the requests, so a loaded machine
    widens them instead of failing."""
    exe = build.program("requests", [FIXTURES / "requests.c"])
    extra = "    age_threshold: 2s\n    warm_up: 0s\n"  # its first objects count too
    with Serve(tmp_path, target_yaml("svc", exe, extra=extra)) as serve:
        app = Requests(exe)
        try:
            app.handle(5)
            time.sleep(4)
            start = time.monotonic()
            app.handle(20000)
            m = serve.scrape()
            took = time.monotonic() - start
        finally:
            app.end()
        serve.wait_log(f"target=svc pid={app.proc.pid} ", 60)
        after = serve.scrape()  # exited: its counts stay, named from its files
        assert serve.stop() == 0
    key = {"target": "svc", "type": "conn"}
    assert metric(m, "refcntd_live_objects", **key) == 20005
    older = metric(m, "refcntd_live_objects_older_than_threshold", **key)
    assert older == 5 if took < 2 else 5 <= older <= 20005, (older, took)
    assert metric(m, "refcntd_live_object_age_seconds_count", **key) == 20005
    if took < 5:  # the first five are 4 s + took old
        assert metric(m, "refcntd_live_object_age_seconds_bucket", le="10.0", **key) == 20005
    assert metric(m, "refcntd_live_object_age_seconds_bucket", le="1.0", **key) <= 20000
    age_sum = metric(m, "refcntd_live_object_age_seconds_sum", **key)
    assert 5 * 3 <= age_sum < 5 * (5 + took) + 20000 * (1 + took), (age_sum, took)
    assert metric(m, "refcntd_operations_total", operation="init", **key) == 20005
    assert metric(m, "refcntd_operations_total", operation="get", **key) == 20005
    assert metric(m, "refcntd_operations_total", operation="init", target="svc",
                  type="session") == 20005
    assert metric(m, "refcntd_live_objects", target="svc", type="session") == 0
    # per (process, type, stack) and per (process, type, second): not per object
    assert metric(m, "refcntd_map_entries", target="svc", map="objects") == 20005
    assert metric(m, "refcntd_map_entries", target="svc", map="allocation_sites") <= 8
    assert metric(m, "refcntd_map_entries", target="svc", map="age_bins") <= 40
    # the first objects' type name was not readable in the kernel (page not present):
    # counted at their site, named by user space, before and after the exit
    for op in ("init", "get", "put", "release"):
        assert metric(after, "refcntd_operations_total", operation=op, **key) == \
            metric(m, "refcntd_operations_total", operation=op, **key), op
    assert metric(after, "refcntd_live_objects", **key) in (None, 0)
    assert metric(after, "refcntd_leaked_objects_total", **key) == 20005


def test_a_full_site_table_makes_the_diff_say_incomplete(bpf, build, tmp_path):
    """Objects the kernel cannot count per site are counted, and the diff says so."""
    exe = build.program("requests", [FIXTURES / "requests.c"])
    with Serve(tmp_path, target_yaml("svc", exe), {"REFCNTD_MAX_ALLOC_SITES": "1"}) as serve:
        url = f"http://127.0.0.1:{serve.port}"
        app = Requests(exe)
        try:
            assert refcntd(["checkpoint", "--url", url]).returncode == 0
            app.handle(50)
            out = refcntd(["diff", "--url", url, "--json"])
            text = refcntd(["diff", "--url", url])
            m = serve.scrape()
        finally:
            app.kill()
        assert serve.stop() == 0
    lost = json.loads(out.stdout)["not_counted"]["svc"]
    assert lost > 0
    assert f"INCOMPLETE: {lost} objects not counted per allocation site" in text.stdout
    assert metric(m, "refcntd_kernel_notes_total", target="svc", note="alloc_sites_full") >= lost
