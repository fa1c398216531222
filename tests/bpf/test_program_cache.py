"""A warm start loads the cached programs and reports exactly what a compile does.

The cache is only worth having if it is used (a warm start must not even load
bcc), and only acceptable if a bad entry or layout can never change a report.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import refcntd
from test_run import assert_perflike_truth

from refcntd.kernel import progcache
from refcntd.kernel.layouts import resized

CACHED = "cached programs, no compile (bcc not loaded)"
MAPS_ONLY = "maps-only compile + cached programs"


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


def entries(cache, prefix=""):
    """The programs' entries, or with prefix "layout-" the maps' layouts."""
    return sorted(p for p in (cache / "bpf").glob(f"{prefix}*.json")
                  if prefix or not p.name.startswith("layout-"))


class Cold:
    """One cold run (a BPF compile, the binary analysed for the first time) whose cache
    every test starts from, restored at the same path: the programs' key depends on it.
    A compile per test made this file the suite's slowest."""

    def __init__(self, exe, base):
        self.exe, self.cache, self.pristine = exe, base / "cache", base / "pristine"
        self.result = run(exe, base, self.cache, "cold")
        assert CACHED not in self.result.stderr and "BPF compile" in self.result.stderr
        shutil.copytree(self.cache, self.pristine, symlinks=True)

    def restored(self):
        shutil.rmtree(self.cache)
        shutil.copytree(self.pristine, self.cache, symlinks=True)
        return self.exe, self.cache


@pytest.fixture(scope="module")
def cold(bpf, build, tmp_path_factory):
    return Cold(build.perflike("O2"), tmp_path_factory.mktemp("progcache"))


@pytest.mark.parametrize("extra", [[], ["--history", "all"]], ids=["default", "history"])
def test_second_run_loads_the_cached_programs(cold, tmp_path, extra):
    """After the shared cold run (one compile), a run with or without --history (a
    knob of the same program) loads the cached programs and reports the same."""
    exe, cache = cold.restored()
    (entry,), layouts = entries(cache), entries(cache, "layout-")
    warm = run(exe, tmp_path, cache, "warm", *extra)
    assert CACHED in warm.stderr, warm.stderr
    assert entries(cache) == [entry] and entries(cache, "layout-") == layouts
    assert shape(warm.report) == shape(cold.result.report)


def test_a_missing_or_wrong_layout_costs_one_maps_only_compile(cold, tmp_path):
    """Without the maps' layout (other map sizes), or with one whose sizes do not fit
    abi.py (its digest intact): one maps-only compile records it again."""
    exe, cache = cold.restored()
    for layout in entries(cache, "layout-"):
        layout.unlink()
    again = run(exe, tmp_path, cache, "again")
    assert MAPS_ONLY in again.stderr and CACHED not in again.stderr, again.stderr
    (layout,) = entries(cache, "layout-")
    data = json.loads(layout.read_text())
    loaded = progcache.load_layout(cache, data["key"])
    objs = next(m for m in loaded.maps if m.name == "objs")
    wrong = tuple(replace(m, value_size=m.value_size + 8) if m is objs else m
                  for m in loaded.maps)
    progcache.store_layout(cache, progcache.Layout(data["key"], wrong, loaded.sizes))
    assert progcache.load_layout(cache, data["key"]).maps == wrong
    fixed = run(exe, tmp_path, cache, "fixed")
    assert MAPS_ONLY in fixed.stderr, fixed.stderr
    assert progcache.load_layout(cache, data["key"]).maps == loaded.maps
    warm = run(exe, tmp_path, cache, "warm")
    assert CACHED in warm.stderr, warm.stderr


def test_other_map_sizes_are_derived_without_a_compile(cold, tmp_path):
    """--max-objects and the probe slots only size maps: the layout recorded at other
    sizes is resized from the declarations, and the maps really have the new sizes."""
    exe, cache = cold.restored()
    (layout,) = entries(cache, "layout-")
    other = run(exe, tmp_path, cache, "other", "--max-objects", "4096")
    assert CACHED in other.stderr, other.stderr
    assert entries(cache, "layout-") == [layout]
    key = json.loads(layout.read_text())["key"]
    sizes = {**progcache.load_layout(cache, key).sizes, "MAX_OBJECTS": "4096"}
    derived = resized(progcache.load_layout(cache, key), sizes)
    assert next(m for m in derived.maps if m.name == "objs").max_entries == 4096


def test_prebuild_leaves_nothing_to_compile(bpf, build, tmp_path):
    """`refcntd prebuild` (setup.sh runs it) compiles one program for every option set:
    the first run of a binary never seen, with another probe count than prebuild's,
    compiles nothing and loads no bcc (tests/bpf/test_no_compile.py: every option)."""
    cache = tmp_path / "cache"
    env = {**os.environ, "REFCNTD_CACHE": str(cache)}
    built = subprocess.run([sys.executable, "-m", "refcntd", "prebuild"], env=env,
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    assert built.stdout.count("BPF compile") == 1, built.stdout
    # the C library's unwind table too: every traced program maps it (issue 43)
    assert "libc.so.6" in built.stdout and any((cache / "cfi").glob("*.cfi")), built.stdout
    again = subprocess.run([sys.executable, "-m", "refcntd", "prebuild"], env=env,
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "BPF compile" not in again.stdout, again.stdout
    first = run(build.perflike("O2"), tmp_path, cache, "first")
    assert CACHED in first.stderr, first.stderr


def test_an_entry_the_kernel_refuses_is_replaced(cold, tmp_path):
    """A consistent entry (its digest matches) with a program the verifier rejects:
    the run compiles anew, reports exactly, and the entry is rewritten."""
    exe, cache = cold.restored()
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


def test_a_corrupt_entry_is_ignored(cold, tmp_path):
    exe, cache = cold.restored()
    (path,) = entries(cache)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    again = run(exe, tmp_path, cache, "again")
    assert CACHED not in again.stderr
    assert json.loads(path.read_text())["digest"]  # rewritten whole
