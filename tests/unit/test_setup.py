"""The explicit tracing setup: describe() changes nothing; failures are typed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refcntd.errors import EnvironmentProblem
from refcntd.kernel import setup
from refcntd.kernel.kheaders import KCONFIG, choose_headers, find_kernel_source
from refcntd.kernel.records import STAGE_LINK, STAGE_OPEN, ProbeFailure


def fake_debian_headers(root: Path, *versions: str) -> Path:
    """Debian's split header packages: kconfig.h in -common, generated files in -amd64."""
    src = root / "src"
    for version in versions or ("9.9.9-1",):
        (src / f"linux-headers-{version}-common" / "include/linux").mkdir(parents=True)
        (src / f"linux-headers-{version}-common" / KCONFIG).write_text("/* */\n")
        (src / f"linux-headers-{version}-amd64" / "include/generated").mkdir(parents=True)
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


def test_the_running_kernels_headers_win_over_a_newer_version(tmp_path, monkeypatch):
    """A string sort put 6.12 before 6.1.0-56 (issue 40): the release must match."""
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    src = fake_debian_headers(tmp_path, "6.1.0-56", "6.12.117+deb12")
    chosen = choose_headers(src, tmp_path / "modules", "6.1.0-56-amd64", tmp_path / "c",
                            create=False)
    assert chosen.path.name == "linux-headers-6.1.0-56-amd64" and chosen.exact
    newer = choose_headers(src, tmp_path / "modules", "6.12.117+deb12-amd64", tmp_path / "c",
                           create=False)
    assert newer.path.name == "linux-headers-6.12.117+deb12-amd64" and newer.exact


def test_without_the_running_kernels_headers_the_nearest_older_are_named(tmp_path, monkeypatch):
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    src = fake_debian_headers(tmp_path, "6.1.0-56", "6.12.117+deb12", "6.19.1-1")
    chosen = choose_headers(src, tmp_path / "modules", "6.18.44-fc-v657", tmp_path / "c",
                            create=False)
    assert chosen.path.name == "linux-headers-6.12.117+deb12-amd64" and not chosen.exact
    assert "6.12.117+deb12" in chosen.why and "6.18.44-fc-v657" in chosen.why
    oldest = choose_headers(src, tmp_path / "modules", "5.10.0-1-amd64", tmp_path / "c",
                            create=False)
    assert oldest.path.name == "linux-headers-6.1.0-56-amd64"


def test_debians_build_link_alone_is_merged_with_its_source_half(tmp_path, monkeypatch):
    """/lib/modules/V/build is only the -amd64 half: given to bcc alone, its compile
    fails on kconfig.h (and libbcc 0.26 then crashes)."""
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    src = fake_debian_headers(tmp_path, "6.1.0-56")
    modules = tmp_path / "modules" / "6.1.0-56-amd64"
    modules.mkdir(parents=True)
    (modules / "build").symlink_to(src / "linux-headers-6.1.0-56-amd64")
    (modules / "source").symlink_to(src / "linux-headers-6.1.0-56-common")
    chosen = choose_headers(tmp_path / "empty", tmp_path / "modules", "6.1.0-56-amd64",
                            tmp_path / "c")
    assert chosen.exact and (chosen.path / KCONFIG).is_file()
    assert (chosen.path / "include/generated").is_dir()
    assert chosen.path.is_relative_to(tmp_path / "c")


def test_half_a_tree_in_bcc_kernel_source_is_one_line(tmp_path, monkeypatch):
    src = fake_debian_headers(tmp_path, "6.1.0-56")
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(src / "linux-headers-6.1.0-56-amd64"))
    with pytest.raises(EnvironmentProblem, match="kconfig.h: half of Debian's split"):
        choose_headers()
