"""What an operator changes while serve runs: SIGHUP tells the truth, retention runs alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from conftest import FIXTURES, leak_summary
from test_run import PERFLIKE_LEAKS
from test_serve import Serve, free_port, metric, target_yaml

from refcntd.binary.elf import read_build_id


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


def _report_of(serve: Serve, pid: int) -> dict:
    serve.wait_log(f"pid={pid} ", 30)
    found = [p for p in serve.reports.glob(f"*-{pid}.json")]
    assert len(found) == 1, found
    return json.loads(found[0].read_text())


def _wait_count(serve: Serve, needle: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while serve.log.count(needle) < n and time.monotonic() < deadline:
        _read_some(serve)
    assert serve.log.count(needle) >= n, serve.log


def _read_some(serve: Serve) -> None:
    try:
        serve.wait_log("\0", 0.5)  # a needle never logged: just reads for 0.5 s
    except AssertionError:
        pass


def test_replaced_binary_is_traced_again(bpf, build, tmp_path):
    target = tmp_path / "perf"
    shutil.copy(build.perflike("O2fp"), target)
    with Serve(tmp_path, target_yaml("perf", target)) as serve:
        first = subprocess.Popen([str(target)], stdout=subprocess.DEVNULL)
        assert first.wait(60) == 0
        assert leak_summary(_report_of(serve, first.pid)["processes"][0]) == PERFLIKE_LEAKS
        before = attached_binaries(serve.scrape())
        # a package upgrade: the new file (another build) is renamed over the old path
        staged = tmp_path / "perf.dpkg-new"
        shutil.copy(build.perflike("O2"), staged)
        os.replace(staged, target)
        serve.wait_log(f"binary={target} replaced (new inode)", 30)
        serve.wait_log(f"binary={target} appeared: attaching", 30)
        _wait_count(serve, f"binary={target} attached", 2)
        second = subprocess.Popen([str(target)], stdout=subprocess.DEVNULL)
        assert second.wait(60) == 0
        report = _report_of(serve, second.pid)
        assert leak_summary(report["processes"][0]) == PERFLIKE_LEAKS
        assert report["tracing"]["complete"], report["tracing"]
        after = attached_binaries(serve.scrape())
        assert serve.stop() == 0
    ids = {build_id(build.perflike(v)) for v in ("O2fp", "O2")}
    assert len(ids) == 2 and set(before) | set(after) == ids
    assert before[build_id(build.perflike("O2fp"))] < after[build_id(build.perflike("O2"))]


def attached_binaries(samples: dict) -> dict[str, float]:
    """build-id -> attach time, from refcntd_binary_attached_since_seconds."""
    out = {}
    for (name, labels), value in samples.items():
        if name == "refcntd_binary_attached_since_seconds":
            out[dict(labels)["build_id"]] = value
    assert len(out) == 1, out  # one binary per path: the replaced one's series is gone
    return out


def build_id(path: Path) -> str | None:
    return read_build_id(path)


def test_binary_created_after_start_is_attached(bpf, build, tmp_path):
    target = tmp_path / "later"
    with Serve(tmp_path, target_yaml("later", target)) as serve:
        assert f"binary={target} cannot attach" in serve.log
        shutil.copy(build.perflike("O2fp"), target)
        serve.wait_log(f"binary={target} attached", 60)
        proc = subprocess.Popen([str(target)], stdout=subprocess.DEVNULL)
        assert proc.wait(60) == 0
        assert leak_summary(_report_of(serve, proc.pid)["processes"][0]) == PERFLIKE_LEAKS
        assert metric(serve.scrape(), "refcntd_target_attach_errors", target="later") == 0
        assert serve.stop() == 0


def test_type_labels_stay_within_the_cap(bpf, build, tmp_path):
    exe = build.program("manytypes", [FIXTURES / "manytypes.c"])
    extra = "    max_type_labels: 50\n"
    with Serve(tmp_path, target_yaml("many", exe, extra=extra)) as serve:
        proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            samples = serve.scrape()
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    live = {dict(labels)["type"]: v for (name, labels), v in samples.items()
            if name == "refcntd_live_objects" and dict(labels)["target"] == "many"}
    assert len(live) == 50 and "_other" in live, sorted(live)
    assert sum(live.values()) == 1000  # folded, never dropped
    assert live["_other"] == 1000 - 49
    assert metric(samples, "refcntd_type_labels_folded", target="many") == 1000 - 49
    series = {labels for (name, labels) in samples if name.startswith("refcntd_")
              and dict(labels).get("target") == "many" and "type" in dict(labels)}
    assert len({dict(labels)["type"] for labels in series}) == 50


def test_types_gone_are_pruned_so_new_types_keep_their_names(bpf, build, tmp_path):
    """1 500 type names over a program's life, one live at a time, against a kernel
    type table of 1 024: every name is still counted under its own label."""
    exe = build.program("churntypes", [FIXTURES / "churntypes.c"])
    n = 1500
    with Serve(tmp_path, target_yaml("churn", exe, extra="    max_type_labels: 2000\n")) as serve:
        proc = subprocess.run([str(exe), str(n)], timeout=120)
        assert proc.returncode == 0
        serve.wait_log("target=churn pid=", 60)
        samples = serve.scrape()
        assert serve.stop() == 0
    inits = {dict(labels)["type"]: v for (name, labels), v in samples.items()
             if name == "refcntd_operations_total" and dict(labels)["target"] == "churn"
             and dict(labels)["operation"] == "init"}
    named = {t: v for t, v in inits.items() if v}
    assert named == {f"c{i}": 1 for i in range(n)}, serve.log[-3000:]
    assert metric(samples, "refcntd_types_pruned_total", target="churn") >= n - 1024
    assert metric(samples, "refcntd_dropped_records_total", target="churn",
                  reason="type_map_full") == 0
