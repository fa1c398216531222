"""A warm start loads the cached programs and reports exactly what a compile does.

The cache is only worth having if it is used (a layout change that made the
maps-only compile miss a map would silently fall back to compiling), and only
acceptable if a bad entry can never change a report.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from conftest import refcntd
from test_run import assert_perflike_truth

from refcntd.kernel import progcache

CACHED = "maps-only compile + cached programs"


def run(exe, tmp_path, cache, name, *extra):
    env = {**os.environ, "REFCNTD_CACHE": str(cache)}
    result = refcntd(["run", "--verbose", *extra, "--", str(exe)], tmp_path / f"{name}.json",
                     env=env)
    assert result.returncode == 23, result.stderr
    assert_perflike_truth(result.report["processes"][0])
    assert result.report["tracing"]["complete"], result.report["tracing"]
    return result


def shape(report):
    """What must not depend on the cache: types, stacks, counts (not addresses, ages)."""
    return [(g["type"], g["stack"], sorted((i["count"], i["gets"], i["puts"])
                                           for i in g["instances"]))
            for g in report["processes"][0]["groups"]]


def entries(cache):
    return sorted((cache / "bpf").glob("*.json"))


@pytest.mark.parametrize("extra", [[], ["--history", "all"]], ids=["default", "history"])
def test_second_run_loads_the_cached_programs(bpf, build, tmp_path, extra):
    exe, cache = build.perflike("O2"), tmp_path / "cache"
    cold = run(exe, tmp_path, cache, "cold", *extra)
    assert CACHED not in cold.stderr and "BPF compile" in cold.stderr, cold.stderr
    (entry,) = entries(cache)
    warm = run(exe, tmp_path, cache, "warm", *extra)
    assert CACHED in warm.stderr, warm.stderr
    assert entries(cache) == [entry]
    assert shape(warm.report) == shape(cold.report)


def test_an_entry_the_kernel_refuses_is_replaced(bpf, build, tmp_path):
    """A consistent entry (its digest matches) with a program the verifier rejects:
    the run compiles anew, reports exactly, and the entry is rewritten."""
    exe, cache = build.perflike("O2"), tmp_path / "cache"
    run(exe, tmp_path, cache, "cold")
    (path,) = entries(cache)
    data = json.loads(path.read_text())
    key = data["key"]
    entry = progcache.load(cache, key)
    assert entry is not None
    good = entry.functions["on_probe"]
    bad = progcache.Function(struct.pack("<BBhi", 0xff, 0, 0, 0) + good.code[8:], good.relocs)
    progcache.store(cache, progcache.Entry(key, entry.maps, {**entry.functions, "on_probe": bad}))
    assert progcache.load(cache, key).functions["on_probe"] == bad
    again = run(exe, tmp_path, cache, "again")
    assert CACHED in again.stderr  # taken from the cache, refused, compiled again
    assert progcache.load(cache, key).functions["on_probe"] == good


def test_a_corrupt_entry_is_ignored(bpf, build, tmp_path):
    exe, cache = build.perflike("O2"), tmp_path / "cache"
    run(exe, tmp_path, cache, "cold")
    (path,) = entries(cache)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    again = run(exe, tmp_path, cache, "again")
    assert CACHED not in again.stderr
    assert json.loads(path.read_text())["digest"]  # rewritten whole
