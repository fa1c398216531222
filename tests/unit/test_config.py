"""Daemon config checks and report retention (pure logic, no BPF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, refcntd

from refcntd.errors import ConfigError
from refcntd.inputs.config import DEFAULT_PORT, Retention, load_config
from refcntd.outputs.reportstore import ReportStore

GOOD = """version: 1
targets:
  - name: perf
    path: /usr/bin/perf*
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "refcntd.yaml"
    path.write_text(text)
    return str(path)


def test_bundled_config_loads():
    config = load_config(ROOT / "configs/refcntd.yaml")
    assert (config.listen_host, config.listen_port) == ("127.0.0.1", DEFAULT_PORT)
    assert [t.name for t in config.targets] == ["perf", "widgets"]
    widgets = config.targets[1]
    assert widgets.history == ("widget",) and widgets.cgroup == "/system.slice/widgetd.service"
    assert config.retention == Retention(1000, 7 * 86400, 100 << 20)


def test_defaults_are_loopback_and_the_default_spec(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert config.listen_host == "127.0.0.1"
    assert config.targets[0].spec.name == "perf-stubs"
    assert config.targets[0].leak_kinds  # held at exit and scanned, as run does
    off = load_config(write(tmp_path, GOOD + "    leak_kinds: false\n"))
    assert not off.targets[0].leak_kinds
    assert off.targets[0].signature() != config.targets[0].signature()  # a reload reattaches
    both = load_config(write(tmp_path, GOOD + "    spec: [glib, gobject]\n"))
    assert both.targets[0].spec.name == "glib+gobject"  # as --spec given twice


@pytest.mark.parametrize("text,line,key", [
    (GOOD + "    colour: red\n", 5, "targets[0].colour"),
    (GOOD.replace("/usr/bin/perf*", "perf"), 4, "targets[0].path"),
    (GOOD + "listen: localhost\n", 5, "listen"),
    (GOOD + "retention: {max_age: 3 weeks}\n", 5, "retention.max_age"),
    (GOOD + "retention: {max_bytes: 10GB}\n", 5, "retention.max_bytes"),
    (GOOD + "  - name: perf\n    path: /bin/x\n", 5, "targets[1]"),
    (GOOD + "    spec: nosuch\n", 5, "targets[0].spec"),
    (GOOD + "    cgroup: system.slice\n", 5, "targets[0].cgroup"),
    (GOOD + "    leak_kinds: sometimes\n", 5, "targets[0].leak_kinds"),
    (GOOD + "    spec: []\n", 5, "targets[0].spec"),
])
def test_bad_config_names_file_line_and_key(tmp_path, text, line, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (info.value.lineno, info.value.key) == (line, key), info.value.message


def test_missing_cgroup_names_file_line_and_key(tmp_path):
    """A cgroup that does not exist is found only when serve attaches: the error still
    points at the config line, like every other config error."""
    from refcntd.service.targets import _cgroup_id
    path = write(tmp_path, GOOD + "    cgroup: /no-such.slice\n")
    (target,) = load_config(path).targets
    with pytest.raises(ConfigError) as info:
        _cgroup_id(target)
    assert (info.value.path, info.value.lineno, info.value.key) == \
        (path, 5, "targets[0].cgroup"), info.value.message
    assert "cgroup /no-such.slice not found under" in info.value.message


def test_serve_check_reports_one_line(tmp_path):
    path = write(tmp_path, GOOD + "    history: 5\n")
    result = refcntd(["serve", "--config", path, "--check"])
    assert_one_line_error(result, f"{path}:5: targets[0].history")


class Clock:
    """Starts at the real time: the age limit compares with files' real mtimes."""

    def __init__(self) -> None:
        import time
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def fill(store: ReportStore, clock: Clock, n: int, size: int = 10) -> None:
    for pid in range(n):
        clock.now += 1
        store.write("t", pid, {"x": "y" * size}, "text\n")


def test_retention_keeps_the_newest_reports(tmp_path):
    clock = Clock()
    store = ReportStore(str(tmp_path / "r"), Retention(max_reports=3), clock)
    fill(store, clock, 5)
    names = [p.name for p in store.reports()]
    assert len(names) == 3 and all(n.endswith(f"-t-{pid}.json")
                                   for n, pid in zip(names, (2, 3, 4), strict=True))
    assert len(list((tmp_path / "r").glob("*.txt"))) == 3
    assert store.stats.pruned == 2


def test_retention_by_total_size(tmp_path):
    clock = Clock()
    store = ReportStore(str(tmp_path / "r"), Retention(max_bytes=3000), clock)
    fill(store, clock, 10, size=1000)  # each pair is a little over 1000 bytes
    total = sum(p.stat().st_size for p in (tmp_path / "r").iterdir())
    assert total <= 3000 and len(store.reports()) == 2
    assert json.loads(store.reports()[-1].read_text()) == {"x": "y" * 1000}


def test_retention_by_age(tmp_path):
    import os
    clock = Clock()
    store = ReportStore(str(tmp_path / "r"), Retention(max_age_s=60), clock)
    fill(store, clock, 2)
    old = store.reports()[0]
    os.utime(old, (clock.now - 120, clock.now - 120))
    fill(store, clock, 1)
    assert old not in store.reports() and len(store.reports()) == 2


def test_a_write_prunes_without_reading_the_directory(tmp_path, monkeypatch):
    """Issue 43's soak: listing and stat'ing every kept report at each write made a
    report cost O(max_reports). After the first read, writes prune from the index."""
    clock = Clock()
    store = ReportStore(str(tmp_path / "r"), Retention(max_reports=5, max_bytes=10**9), clock)
    fill(store, clock, 3)

    def listed() -> list:
        raise AssertionError("the directory was read at a write")
    monkeypatch.setattr(store, "reports", listed)
    for pid in range(100, 110):
        clock.now += 1
        store.write("t", pid, {"x": "y"}, "text\n")
    names = sorted(p.name for p in (tmp_path / "r").glob("*.json"))
    assert [n.rsplit("-", 1)[1] for n in names] == [f"{p}.json" for p in range(105, 110)]
    assert store.stats.pruned == 8


def test_prune_rereads_the_directory(tmp_path):
    """Files removed by someone else are not counted against the limits after prune()."""
    clock = Clock()
    store = ReportStore(str(tmp_path / "r"), Retention(max_reports=3), clock)
    fill(store, clock, 3)
    for path in store.reports()[:2]:
        path.unlink()
    store.prune()
    fill(store, clock, 2)
    assert len(store.reports()) == 3 and store.stats.pruned == 0
