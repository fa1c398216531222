"""The service's pieces that need no kernel: rules, the HTTP endpoint, --check --strict,
the collectors' describe()."""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, refcntd
from prometheus_client import CollectorRegistry, Counter

from refcntd.service import httpserver

RULES_DIR = ROOT / "configs" / "prometheus"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool missing: scripts/setup.sh installs Debian's prometheus")
    return found


def test_shipped_rules_pass_promtool_check():
    out = subprocess.run([_promtool(), "check", "rules", "refcntd-rules.yml"], cwd=RULES_DIR,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_shipped_rules_pass_their_promtool_unit_tests():
    out = subprocess.run([_promtool(), "test", "rules", "refcntd-rules.test.yml"],
                         cwd=RULES_DIR, capture_output=True, text=True)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_metrics_answer_503_until_ready_then_200():
    registry = CollectorRegistry()
    Counter("probe_hits", "test counter", registry=registry).inc()
    ready = httpserver.Readiness()
    server = httpserver.start("127.0.0.1", 0, registry, ready, lambda: {"targets": {}})
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/metrics", timeout=5)
        assert err.value.code == 503
        ready.set()
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            assert "probe_hits_total 1.0" in r.read().decode()
        with urllib.request.urlopen(f"{url}/status", timeout=5) as r:
            assert b'"ready": true' in r.read()
    finally:
        server.shutdown()
        server.server_close()


def test_serve_check_strict_checks_the_targets(tmp_path: Path):
    config = tmp_path / "refcntd.yaml"
    config.write_text("version: 1\ntargets:\n  - name: t\n    path: /bin/true\n"
                      "    spec: perf-stubs\n")
    plain = refcntd(["serve", "--check", "--config", str(config)])
    assert plain.returncode == 0, plain.stderr
    strict = refcntd(["serve", "--check", "--strict", "--config", str(config)])
    assert strict.returncode == 24, strict.stdout + strict.stderr
    assert "target t: /bin/true: CANNOT ATTACH" in strict.stdout
    assert "Traceback" not in strict.stderr



def test_diff_without_a_running_serve_is_one_line():
    result = refcntd(["diff", "--url", "http://127.0.0.1:9"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_describe_names_every_family_collect_yields():
    """client_python's Collector protocol: describe() (used at registration, so nothing
    reads the kernel then) must name exactly the families a scrape produces."""
    import contextlib

    from refcntd.outputs.reportstore import StoreStats
    from refcntd.service.metrics import BuildInfo, RefcntdCollector, TargetStats

    views = []

    @contextlib.contextmanager
    def view():
        views.append(1)
        yield [TargetStats("svc", 60.0)]
    for collector in (RefcntdCollector(view, StoreStats), BuildInfo("0", "0")):
        registry = CollectorRegistry()
        registry.register(collector)  # through describe(): no scrape yet
        described = [(m.name, m.type, m.samples) for m in collector.describe()]
        collected = [(m.name, m.type) for m in collector.collect()]
        assert [(n, t) for n, t, _ in described] == collected
        assert all(samples == [] for _, _, samples in described)
    assert views == [1]  # the one collect() above
