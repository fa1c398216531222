"""refcntd serve scraped by a real Prometheus evaluating the shipped rules.

The rules' windows (15m growth, 30m `for`) are shortened to seconds in a
copy, nothing else is changed: the test proves the expressions fire on a
leaking long-running program and stay quiet on a healthy one.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import FIXTURES, ROOT
from test_serve import Serve, free_port, target_yaml

RULES = ROOT / "configs" / "prometheus" / "refcntd-rules.yml"


def _fast_rules(tmp: Path) -> Path:
    text = RULES.read_text().replace("[15m]", "[10s]").replace("for: 30m", "for: 4s")
    assert "[10s]" in text and "for: 4s" in text  # the shipped windows are still these
    out = tmp / "rules.yml"
    out.write_text(text)
    return out


class Prometheus:
    """A real Prometheus on loopback scraping refcntd every second."""

    def __init__(self, tmp: Path, target_port: int) -> None:
        self.port = free_port()
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{_fast_rules(tmp)}]\n"
            "scrape_configs:\n  - job_name: refcntd\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def api(self, path: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    def alerts(self) -> list[dict]:
        try:
            return list(self.api("alerts")["data"]["alerts"])
        except OSError:
            return []

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _firing(alerts: list[dict], name: str, target: str) -> bool:
    return any(a["labels"].get("alertname") == name and a["labels"].get("target") == target
               and a["state"] == "firing" for a in alerts)


def test_growth_alert_fires_for_a_leaking_service_only(bpf, build, tmp_path):
    exe = build.program("service", [FIXTURES / "service.c"])
    leaky, clean = tmp_path / "leaky", tmp_path / "clean"
    shutil.copy(exe, leaky)
    shutil.copy(exe, clean)
    targets = target_yaml("leaky", leaky) + target_yaml("clean", clean)
    with Serve(tmp_path, targets) as serve:
        prom = Prometheus(tmp_path, serve.port)
        programs = [subprocess.Popen([str(leaky), "leak"]), subprocess.Popen([str(clean)])]
        try:
            deadline, alerts = time.monotonic() + 90, []
            while time.monotonic() < deadline and not _firing(alerts, "RefcntdObjectsGrowing",
                                                                  "leaky"):
                time.sleep(1)
                alerts = prom.alerts()
            assert _firing(alerts, "RefcntdObjectsGrowing", "leaky"), alerts
            growing = [a for a in alerts if a["labels"].get("alertname") ==
                       "RefcntdObjectsGrowing"]
            assert {a["labels"]["target"] for a in growing} == {"leaky"}, growing
            assert growing[0]["labels"]["type"] == "conn"
            up = prom.api('query?query=up{job="refcntd"}')["data"]["result"]
            assert up and up[0]["value"][1] == "1"
            live = prom.api("query?query=refcntd_live_objects")["data"]["result"]
            by_target = {r["metric"]["target"]: float(r["value"][1]) for r in live}
            assert by_target["leaky"] > 20 and by_target["clean"] <= 1, by_target  # 0, not absent
            assert not [a for a in alerts if a["labels"].get("alertname") in
                        ("RefcntdTracingIncomplete", "RefcntdTargetNotAttached",
                         "RefcntdAnomalies")], alerts
        finally:
            for p in programs:
                p.kill()
                p.wait()
            prom.stop()
        assert serve.stop() == 0


def test_idle_connection_does_not_block_a_scrape(bpf, build, tmp_path):
    exe = build.program("service", [FIXTURES / "service.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        idle = [socket.create_connection(("127.0.0.1", serve.port)) for _ in range(3)]
        half = socket.create_connection(("127.0.0.1", serve.port))
        half.sendall(b"GET /metrics HTTP/1.1\r\n")  # a request never finished
        try:
            # the idle clients hold their connections for the 10 s read timeout;
            # a scrape must not wait for them (a single-threaded server would)
            with urllib.request.urlopen(f"http://127.0.0.1:{serve.port}/metrics",
                                        timeout=5) as r:
                text = r.read().decode()
            assert "refcntd_build_info{" in text and "refcntd_live_objects" in text
            with urllib.request.urlopen(f"http://127.0.0.1:{serve.port}/status",
                                        timeout=10) as r:
                status = json.loads(r.read())
            assert status["ready"] is True
            assert str(exe) in status["targets"]["svc"]["attached"]
        finally:
            for s in [*idle, half]:
                s.close()
        assert serve.stop() == 0
