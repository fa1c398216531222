"""Checkpoint/diff on a program that never exits: exactly the leaked site and count."""

from __future__ import annotations

import json
import signal
import subprocess

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
            out = refcntd(["diff", "--url", url, "--json"])
            text = refcntd(["diff", "--url", url])
            serve.proc.send_signal(signal.SIGUSR2)  # the same, written as a report file
            serve.wait_log("diff since the checkpoint written")
        finally:
            app.kill()
        assert serve.stop() == 0
    assert out.returncode == 0, out.stderr
    processes = json.loads(out.stdout)["targets"]["svc"]
    assert [p["pid"] for p in processes] == [app.proc.pid]
    groups = processes[0]["groups"]
    assert [(g["type"], g["objects"]) for g in groups] == [("conn", 7)]
    assert {i["count"] for i in groups[0]["instances"]} == {1}
    assert functions(groups[0])[:4] == ["__refcnt__init", "obj_new", "handle_request", "main"]
    assert "target svc:" in text.stdout and "7 objects of type 'conn'" in text.stdout, \
        text.stdout
    written = [p for p in serve.reports.glob("*-diff-*.json")]
    assert len(written) == 1
    assert json.loads(written[0].read_text())["targets"]["svc"][0]["groups"][0]["objects"] == 7

