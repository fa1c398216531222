"""The HTTP endpoint of a real `refcntd serve`, attacked by a local user: every client
here runs as `nobody` (setpriv), against real BPF and real sockets."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

from conftest import FIXTURES
from test_checkpoint import Requests
from test_serve import Serve, target_yaml

SECRET = "--token=hunter2-do-not-leak"

# A client as nobody: prints "STATUS BODY" of one request (stdlib only, Debian's python).
CLIENT = """
import http.client, sys
port, method, path, host, origin = sys.argv[1:6]
conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
headers = {"Host": host}
if origin:
    headers["Origin"] = origin
conn.request(method, path, headers=headers)
r = conn.getresponse()
print(r.status, r.read().decode(errors="replace").replace("\\n", " "))
"""

# Slow clients as nobody: N connections each sending one header byte every 2 s; prints
# how many the server closed and after how long (the slowest), or 'open' for the rest.
SLOW = """
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks, start = [], time.monotonic()
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\\r\\n")
    socks.append(s)
closed, busy, last = 0, 0, 0.0
alive = list(socks)
while alive and time.monotonic() - start < 40:
    time.sleep(2)
    for s in list(alive):
        try:
            s.setblocking(False)
            data = s.recv(4096)
            if data.startswith(b"HTTP/1.1 503"):
                busy += 1
            gone = data == b"" or data.startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if not gone:
            try:
                s.setblocking(True)
                s.sendall(b"X")
            except OSError:
                gone = True
        if gone:
            alive.remove(s)
            closed += 1
            last = time.monotonic() - start
print(closed, busy, len(alive), round(last, 1))
"""


def as_nobody(code: str, *args: object, timeout: float = 60) -> str:
    out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                          "/usr/bin/python3", "-c", code, *map(str, args)],
                         capture_output=True, text=True, timeout=timeout, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def request(port: int, method: str, path: str, host: str | None = None,
            origin: str = "") -> tuple[int, str]:
    status, _, body = as_nobody(CLIENT, port, method, path, host or f"127.0.0.1:{port}",
                                origin).partition(" ")
    return int(status), body


def test_state_changes_are_off_and_command_lines_hidden_by_default(bpf, build, tmp_path):
    exe = build.program("requests", [FIXTURES / "requests.c"])
    with Serve(tmp_path, target_yaml("svc", exe), web="") as serve:
        app = Requests(exe)
        app.proc.kill()  # started again with a secret on its command line
        app.proc.wait()
        app.proc = subprocess.Popen([str(exe), SECRET], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        try:
            app.handle(3)
            status, body = request(serve.port, "POST", "/checkpoint")
            live_status, live = request(serve.port, "GET", "/live")
        finally:
            app.kill()
        assert serve.stop() == 0
    assert status == 403 and "web.enable_checkpoint" in body, body
    assert "checkpoint at" not in serve.log
    assert live_status == 200
    (process,) = json.loads(live)["targets"]["svc"]
    assert process["pid"] == app.proc.pid and process["command"] == []
    assert process["comm"] == "requests" and SECRET not in live


def test_foreign_host_and_origin_are_refused(bpf, build, tmp_path):
    """DNS rebinding (a foreign Host) and a cross-site form (a foreign Origin) cannot set a
    checkpoint, even with checkpoints enabled; the same request from the host itself can."""
    exe = build.program("requests", [FIXTURES / "requests.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        rebinding = request(serve.port, "POST", "/checkpoint", host="evil.example")
        cross = request(serve.port, "POST", "/checkpoint",
                        origin="http://evil.example")
        metrics_rebinding = request(serve.port, "GET", "/live", host="evil.example:80")
        same = request(serve.port, "POST", "/checkpoint", host=f"localhost:{serve.port}",
                       origin=f"http://localhost:{serve.port}")
        assert serve.stop() == 0
    assert rebinding[0] == 403 and "Host" in rebinding[1]
    assert cross[0] == 403 and "cross-origin" in cross[1]
    assert metrics_rebinding[0] == 403
    assert same[0] == 200 and "checkpoint" in same[1]
    assert serve.log.count("checkpoint at") == 1


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_slow_clients_are_capped_and_cut_at_the_head_deadline(bpf, build, tmp_path):
    """20 connections dribbling a header byte every 2 s, 8 allowed at once: 12 are told
    503 at once, the 8 others are closed by the 10 s head deadline although they keep
    sending, the daemon never holds more than 8 connection threads, and a scrape after
    the attack is served."""
    exe = build.program("requests", [FIXTURES / "requests.c"])
    web = "web:\n  max_connections: 8\n"
    with Serve(tmp_path, target_yaml("svc", exe), web=web) as serve:
        before = threads(serve.proc.pid)
        attack = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup",
                                   "--clear-groups", "/usr/bin/python3", "-c", SLOW,
                                   str(serve.port), "20"],
                                  stdout=subprocess.PIPE, text=True, cwd="/")
        peak = before
        while attack.poll() is None:
            peak = max(peak, threads(serve.proc.pid))
            time.sleep(0.2)
        closed, busy, still_open, slowest = attack.stdout.read().split()
        with urllib.request.urlopen(f"http://127.0.0.1:{serve.port}/metrics", timeout=30) as r:
            after = r.status
        assert serve.stop() == 0
    assert (int(closed), int(busy), int(still_open)) == (20, 12, 0)
    assert 9 <= float(slowest) <= 16, slowest  # the deadline (10 s) plus one 2 s poll
    assert peak - before <= 8, (before, peak)
    assert after == 200
    assert "Traceback" not in serve.log
