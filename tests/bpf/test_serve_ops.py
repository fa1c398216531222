"""What an operator changes while serve runs: SIGHUP tells the truth, retention runs alone."""

from __future__ import annotations

import signal

from conftest import FIXTURES
from test_serve import Serve, free_port, target_yaml


def test_reload_applies_what_it_can_and_says_what_needs_a_restart(bpf, build, tmp_path):
    exe = build.program("service", [FIXTURES / "service.c"])
    with Serve(tmp_path, target_yaml("svc", exe)) as serve:
        new_dir = tmp_path / "elsewhere"
        new_dir.mkdir()
        for i in range(5):  # old reports in the new directory, beyond max_reports
            for suffix in (".json", ".txt"):
                (new_dir / f"2020010{i}T000000.000000Z-svc-{i}{suffix}").write_text("{}\n")
        old_port = serve.port
        serve.config.write_text(
            f"version: 1\nlisten: 127.0.0.1:{free_port()}\nreport_dir: {new_dir}\n"
            "retention: {max_reports: 2}\ntargets:\n"
            + target_yaml("svc", exe, extra="    age_threshold: 42s\n"))
        serve.proc.send_signal(signal.SIGHUP)
        serve.wait_log("reloaded")
        assert f"needs a restart; still listening on 127.0.0.1:{old_port}" in serve.log
        assert f"report_dir {serve.reports} -> {new_dir}" in serve.log
        assert "target=svc age_threshold 300s -> 42s" in serve.log
        # retention applied at once, without waiting for the next report
        assert sorted(p.name for p in new_dir.glob("*.json")) == [
            "20200103T000000.000000Z-svc-3.json", "20200104T000000.000000Z-svc-4.json"]
        assert serve.scrape()  # still served on the old port
        assert serve.stop() == 0
