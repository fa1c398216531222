"""Leak kinds of objects in GSlice's slabs (GLib 2.74 without G_SLICE=always-malloc):
refcntd reads the slabs (refcntd/reach/gslice.py) and must give each GstCaps and
GObject the kind valgrind gives it with G_SLICE=always-malloc, where each has a
malloc block of its own, at exit (`run`) and live (`GET /leaks`).  GLib 2.76 and
later (Debian 13's 2.84) have no slabs (g_slice_alloc is g_malloc): there the same
comparison checks the kinds of plain malloc blocks, and valgrind's records name a
GstCaps by gst_caps_new_empty calling the allocator, without g_slice_alloc's frame.

tests/fixtures/gslicekinds.c makes each kind in a function of its own, so valgrind's
loss records name the objects by that frame.  Lost or reachable is compared object
by object; within lost, which block of a lost cycle is the definitely lost one is
the lowest address (valgrind's rule, refcntd's too), and GSlice and glibc place
blocks elsewhere than valgrind's allocator does: the split is compared where no
cycle decides it (caps held only by a lost GPtrArray)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FIXTURES, cc, pkg_config_flags, refcntd, start_hanging
from reachtruth import ALLOCATORS, gobject_requests, is_gobject, loss_records
from test_serve import Serve, target_yaml

SITES = ("lost_caps", "kept_caps", "held_caps", "lost_objects", "kept_objects_")
LOST, REACHABLE = "lost", "still reachable"
TRUTH = {"lost_caps": {LOST: 40}, "kept_caps": {REACHABLE: 20}, "held_caps": {LOST: 12},
         "lost_objects": {LOST: 12}, "kept_objects_": {REACHABLE: 6}}
PRIVATE = ["libglib-2.0.so.0", "libgobject-2.0.so.0", "libgmodule-2.0.so.0", "libc.so.6",
           "libgstreamer-1.0.so.0"]


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("gslice")
    program = cc(out / "gslicekinds", [FIXTURES / "gslicekinds.c"],  # not stripped: valgrind
                 ["-O2", "-g", *pkg_config_flags("gstreamer-1.0")])  # names its frames
    subprocess.run([str(program), "exit"], check=True, capture_output=True)  # the registry
    return program


@pytest.fixture(scope="module")
def truth(exe, tmp_path_factory):
    """valgrind's kinds per site with G_SLICE=always-malloc, through private copies of
    ld.so and the libraries (a uprobe's int3 in the system's files would SIGTRAP it)."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind (Debian's valgrind package) is the oracle of these tests")
    libs = tmp_path_factory.mktemp("private")
    shutil.copy("/lib64/ld-linux-x86-64.so.2", libs / "ld.so")
    for name in PRIVATE:
        shutil.copy(Path("/usr/lib/x86_64-linux-gnu") / name, libs / name)
    env = {**os.environ, "G_SLICE": "always-malloc", "LD_LIBRARY_PATH": str(libs)}
    proc = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                           "--num-callers=16", str(libs / "ld.so"), str(exe), "exit"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert "LEAK SUMMARY" in proc.stderr and "SIGTRAP" not in proc.stderr, proc.stderr[-2000:]
    return valgrind_sites(proc.stderr)


def valgrind_sites(text: str) -> dict[str, Counter[str]]:
    """The blocks that are the fixture's objects, by site: a GstCaps's (allocated by
    gst_caps_new_empty through the allocators only: not its GArray's), a GObject's
    (reachtruth.is_gobject)."""
    requests = gobject_requests(text)
    out: dict[str, Counter[str]] = {}
    for kind, blocks, frames in loss_records(text):
        names = [f for _, f in frames]
        site = next((n for n in names if n in SITES), None)
        if site is not None and _is_object(names, frames[0][0], requests):
            out.setdefault(site, Counter())[kind] += blocks
    return out


def _is_object(names: list[str], top: int, requests: list[int]) -> bool:
    if "gst_caps_new_empty" in names:  # its own block, not its GArray's
        at = names.index("gst_caps_new_empty")
        if at and set(names[:at]) <= ALLOCATORS:
            return True
    return is_gobject(names, top, requests)


def objects(stdout: str) -> dict[int, str]:
    """address -> site, from the fixture's OBJ lines (its GstBins were made by
    lost_objects too)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("OBJ "):
            _, site, address = line.split()
            out[int(address, 16)] = {"lost_bins": "lost_objects",
                                     "kept_objects": "kept_objects_"}.get(site, site)
    return out


def by_site(made: dict[int, str], process: dict) -> dict[str, Counter[str]]:
    found = {int(i["address"], 16): i.get("kind", "no kind") for g in process["groups"]
             for i in g["instances"]}
    out: dict[str, Counter[str]] = {}
    for address, site in made.items():
        out.setdefault(site, Counter())[found.get(address, "not listed")] += 1
    return out


def lost_or_not(kinds: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for site, counts in kinds.items():
        for kind, n in counts.items():
            kind = LOST if kind.endswith(" lost") else \
                REACHABLE if kind == "possibly lost" else kind
            out.setdefault(site, {})[kind] = out.get(site, {}).get(kind, 0) + n
    return out


def test_valgrinds_truth(truth):
    """The oracle itself: each site's objects all of one kind, as the fixture made them."""
    assert lost_or_not(truth) == TRUTH, truth
    assert truth["held_caps"] == {"indirectly lost": 12}


def one_stale_pointer(got: dict[str, dict[str, int]], want: dict[str, dict[str, int]]) -> bool:
    """Whether `got` differs from `want` by one lost object alone, found still reachable
    (or not listed): a dead copy of its pointer left in memory, the stale-pointer effect
    of docs/leak-kinds.md, seen in about 1 run in 20 of this fixture (its cause in this
    program not found).  Such a run is run once more, and that run must be exact."""
    diff = [site for site in set(got) | set(want) if got.get(site) != want.get(site)]
    if len(diff) != 1:
        return False
    g, w = got.get(diff[0], {}), want.get(diff[0], {})
    kept = {k: n for k, n in g.items() if k != LOST}
    return g.get(LOST, 0) == w.get(LOST, 0) - 1 and sum(kept.values()) == 1 and \
        sum(g.values()) == sum(w.values())


def exit_kinds(exe: Path, tmp_path: Path) -> tuple[dict[str, Counter[str]], dict, str]:
    result = refcntd(["run", "--spec", "gstreamer", "--", str(exe), "exit"],
                     tmp_path / "r.json", env={**os.environ, "G_SLICE": ""}, timeout=600)
    assert result.report is not None, result.stderr
    (process,) = [p for p in result.report["processes"]
                  if p.get("command", [""])[0] == str(exe)]
    return by_site(objects(result.stdout), process), result.report, " ".join(process.get(
        "notes", []))


def test_kinds_at_exit_equal_valgrinds(bpf, exe, truth, tmp_path):
    got, report, notes = exit_kinds(exe, tmp_path)
    if one_stale_pointer(lost_or_not(got), lost_or_not(truth)):
        (tmp_path / "again").mkdir()
        got, report, notes = exit_kinds(exe, tmp_path / "again")
    assert lost_or_not(got) == lost_or_not(truth), (got, truth)
    assert got["held_caps"] == truth["held_caps"]
    notes = " ".join(report["tracing"]["notes"]) + " " + notes
    assert "sharing a malloc block" not in notes and "GSlice slab" not in notes, notes


def leaks_of(serve: Serve, name: str, proc: subprocess.Popen, after_s: float,
             ready: Callable[[], str] = str) -> tuple[dict, str]:
    """`ready()` (what the process printed up to then), GET /leaks `after_s` seconds on,
    then the process killed (even when a step fails) and serve stopped: the process's
    report under target `name`, and what `ready` read."""
    try:
        printed = ready()
        time.sleep(after_s)
        answer = serve.leaks(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert serve.stop() == 0
    (process,) = [p for p in answer["targets"][name]["run"]["processes"]
                  if p["pid"] == proc.pid]
    return process, printed


def live_kinds(exe: Path, tmp_path: Path) -> dict[str, Counter[str]]:
    with Serve(tmp_path, target_yaml("gsk", exe, spec="gstreamer"),
               env={"G_SLICE": ""}) as serve:
        proc, printed = start_hanging(exe, env={**os.environ, "G_SLICE": ""})
        process, _ = leaks_of(serve, "gsk", proc, 0.5)
    return by_site(objects(printed), process)


def test_leaks_live_equal_valgrinds(bpf, exe, truth, tmp_path):
    """GET /leaks on the process while it runs: the objects lost now are the lost ones
    valgrind names at exit (nothing the fixture made is lost later), and the kept ones
    are not listed (still reachable is no leak of a live process)."""
    lost = {s: c for s, c in lost_or_not(truth).items() if LOST in c}
    got = live_kinds(exe, tmp_path)
    if one_stale_pointer({s: c for s, c in lost_or_not(got).items() if s in lost}, lost):
        (tmp_path / "again").mkdir()
        got = live_kinds(exe, tmp_path / "again")
    assert {s: c for s, c in lost_or_not(got).items() if s in lost} == lost, got
    assert {s: dict(c) for s, c in got.items() if s not in lost} == \
        {"kept_caps": {"not listed": 20}, "kept_objects_": {"not listed": 6}}, got
    assert got["held_caps"] == truth["held_caps"]


def live_leaks(tmp_path: Path, name: str, path: Path, argv: list[str]
               ) -> tuple[dict, str, int]:
    """GET /leaks on a process of Debian's programs started as users start them (no
    G_SLICE), 3 s after it started (the leaker: after it printed READY): its report, what
    it printed, its pid."""
    env = {k: v for k, v in os.environ.items() if k != "G_SLICE"}
    with Serve(tmp_path, target_yaml(name, path, spec="gstreamer")) as serve:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        out = proc.stdout

        def until_ready() -> str:
            printed = ""
            while argv[0].endswith("capsleak") and "READY" not in printed:
                line = out.readline()
                assert line, "the leaker ended early"
                printed += line
            return printed
        process, printed = leaks_of(serve, name, proc, 3, until_ready)
    return process, printed, proc.pid


def test_python_ctypes_caps_leaker_live(bpf, tmp_path):
    """Issue 58's leaker: python3 (a private copy, the target's binary) leaks 30 of 60
    caps through ctypes; with GSlice /leaks gave 0 of them, now all 30, each lost (no
    pointer to it is left; definitely or indirectly: a caps and its structure point at
    each other, and the lower address of the two leads, as in valgrind)."""
    python = tmp_path / "capsleak"
    shutil.copy(Path("/usr/bin/python3").resolve(), python)  # Debian's, not a shim
    process, printed, _ = live_leaks(tmp_path, "pyleak", python,
                                     [str(python), str(FIXTURES / "capsleak.py")])
    books = {int(line.split()[2], 16) for line in printed.splitlines()
             if line.startswith("leak GstCaps")}
    found = {int(i["address"], 16): i.get("kind") for g in process["groups"]
             for i in g["instances"]}
    assert len(books) == 30, printed
    assert {a for a in books if found.get(a) in ("definitely lost", "indirectly lost")} == \
        books, found
    assert not [n for n in process.get("notes", []) if "sharing a malloc block" in n]


def test_gst_launch_pipeline_live(bpf, tmp_path):
    """Debian's gst-launch-1.0 running a pipeline: its objects in GSlice's slabs get
    kinds (the issue's note of 435 objects sharing a block is gone) and none is lost."""
    launch = Path(shutil.which("gst-launch-1.0") or "/usr/bin/gst-launch-1.0")
    process, _, _ = live_leaks(tmp_path, "gst", launch.resolve(),
                               [str(launch), "-q", "audiotestsrc", "!", "audioconvert", "!",
                                "fakesink"])
    notes = " ".join(process.get("notes", []))
    assert "sharing a malloc block" not in notes and "GSlice slab" not in notes, notes
    assert [g for g in process["groups"] if g["kind"].endswith("lost")] == [], process
