"""Checkpoint/diff on a program that never exits: exactly the leaked site and count."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request

from conftest import FIXTURES, functions, refcntd
from test_serve import Serve, target_yaml


class Requests:
    """tests/fixtures/requests.c: each request leaks one 'conn' and frees the rest."""

    def __init__(self, exe) -> None:
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def handle(self, n: int) -> None:
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


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

