"""The explicit tracing setup: describe() changes nothing; failures are typed."""

from __future__ import annotations

import os
from pathlib import Path

from refcntd.kernel import setup
from refcntd.kernel.kheaders import find_kernel_source
from refcntd.kernel.records import STAGE_LINK, STAGE_OPEN, ProbeFailure


def fake_debian_headers(root: Path) -> Path:
    src = root / "src"
    for name in ("linux-headers-9.9.9-1-common", "linux-headers-9.9.9-1-amd64"):
        (src / name / "include").mkdir(parents=True)
    return src


def test_naming_the_headers_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    src, cache = fake_debian_headers(tmp_path), tmp_path / "cache"
    named = find_kernel_source(src, tmp_path / "modules", "9.9.9-1-amd64", cache, create=False)
    assert named == cache / "kernel-headers" / "linux-headers-9.9.9-1-amd64"
    assert not cache.exists()
    built = find_kernel_source(src, tmp_path / "modules", "9.9.9-1-amd64", cache)
    assert built == named and (built / "include").is_dir()


def test_describe_changes_no_environment_variable():
    before = dict(os.environ)
    env = setup.describe()
    assert dict(os.environ) == before
    assert not env.tracefs_mounted_here
    text = "\n".join(env.lines())
    assert "privileges: " in text and "tracefs: " in text and "BCC_KERNEL_SOURCE" in text


def test_probe_statuses_follow_typed_failures_of_both_stages():
    """A link failure's site is known by index: it can never be shown installed."""
    from refcntd.binary.probesite import ProbeSite
    from refcntd.session.status import probe_statuses

    class FakePlan:  # probe_statuses reads only the sites
        sites = [ProbeSite(role, f"f_{role}", "/m", 0, 4, 0, "cheap", "why", -1, False,
                           None, None) for role in ("init", "get", "put")]

    failures = [ProbeFailure(1, STAGE_LINK, 24, "Too many open files"),
                ProbeFailure(2, STAGE_OPEN, 22, "invalid argument")]
    statuses = probe_statuses(FakePlan(), failures)
    assert [s.installed for s in statuses] == [True, False, False]
    assert statuses[1].error == "bpf link failed: Too many open files"
    assert statuses[2].error == "perf_event_open failed: invalid argument"
