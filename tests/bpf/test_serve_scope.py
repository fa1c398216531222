"""serve with two targets on one spec that probes a shared library every traced
program maps (issue 58): each process belongs to the target whose program it runs,
is scanned once, reported once; the metrics, the log and the report say the same."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_serve import Serve, metric

SPEC = """version: 1
name: stubs-in-lib
description: the stub set, probed in librefcnt.so (every program here maps it)
library: librefcnt.so
roles:
  init: {functions: [__refcnt__init], object: arg3, type: arg4, initial_count: arg2}
  get: {functions: [__refcnt__get], object: arg2}
  put: {functions: [__refcnt__put], object: arg2}
  delete: {functions: [refcnt__delete], object: arg1}
"""


def programs(build, tmp: Path) -> tuple[Path, Path, Path]:
    """(alpha, beta, spec): two programs of scoped.c on one librefcnt.so."""
    alpha, beta = (build.program(f"scoped_{t}", [FIXTURES / "scoped.c"], shared_stubs=True,
                                 flags=[f'-DTYPE="{t}"', "-pthread"])
                   for t in ("alpha", "beta"))
    spec = tmp / "stubs-in-lib.yaml"
    spec.write_text(SPEC)
    return alpha, beta, spec


def targets(alpha: Path, beta: Path, spec: Path) -> str:
    return "".join(f"  - name: {name}\n    path: {exe}\n    spec: {spec}\n"
                   f"    age_threshold: 1s\n    warm_up: 2s\n"
                   for name, exe in (("a", alpha), ("b", beta)))


class Program:
    """A running scoped.c, driven a line at a time; killed even when a test fails."""

    def __init__(self, exe: Path, released: int, leaked: int) -> None:
        self.proc = subprocess.Popen([str(exe), str(released), str(leaked)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        assert self.proc.stdout.readline().strip() == "ready"

    def say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "done"

    def exit(self) -> None:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def reports_of(serve: Serve, pid: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(serve.reports.glob(f"*-{pid}.json"))]


def series(samples: dict, name: str, target: str) -> dict[str, float]:
    """type -> value of one target's family `name`."""
    return {dict(labels)["type"]: v for (n, labels), v in samples.items()
            if n == name and dict(labels).get("target") == target}


def test_two_targets_on_a_library_spec_each_trace_their_own_program(bpf, build, tmp_path):
    alpha, beta, spec = programs(build, tmp_path)
    with Serve(tmp_path, targets(alpha, beta, spec)) as serve:
        a, b = Program(alpha, 2, 3), Program(beta, 4, 5)
        try:
            m = serve.scrape()  # the first scrape: releases already happened
            scans = serve.leaks()["targets"]
            time.sleep(3.5)  # warm: a's next objects are no start-up registry
            a.say("more 2")
            time.sleep(2.5)  # older than the threshold (1 s; ages are exact to the second)
            aged = serve.scrape()
            b.say("lose 4")  # pointers only in a freed block: lost at exit
            a.exit()
            b.exit()
            serve.wait_log(f"target=a pid={a.pid} ")
            serve.wait_log(f"target=b pid={b.pid} ")
            after = serve.scrape()
        finally:
            a.kill()
            b.kill()
        assert serve.stop() == 0
    live = "refcntd_live_objects"
    assert series(m, live, "a") == {"alpha": 3} and series(m, live, "b") == {"beta": 5}
    ops = "refcntd_operations_total"
    assert metric(m, ops, target="a", type="alpha", operation="init") == 5
    assert metric(m, ops, target="a", type="alpha", operation="release") == 2
    assert metric(m, ops, target="b", type="beta", operation="release") == 4
    # one process each (their idle threads are not processes), under the program's path,
    # as refcntd_binary_attached_since_seconds names it
    for target, exe in (("a", alpha), ("b", beta)):
        assert metric(m, "refcntd_traced_processes", target=target, binary=str(exe)) == 1
        assert [dict(k)["binary"] for n, k in m
                if n == "refcntd_binary_attached_since_seconds"
                and dict(k)["target"] == target] == [str(exe)]
    # the objects made in the first warm_up seconds are not "older than threshold"
    older = "refcntd_live_objects_older_than_threshold"
    assert series(aged, live, "a") == {"alpha": 5} and series(aged, live, "b") == {"beta": 5}
    assert series(aged, older, "a") == {"alpha": 2} and series(aged, older, "b") == {"beta": 0}
    # GET /leaks stops each process once, under its own target
    assert [s["pid"] for s in scans["a"]["scans"]] == [a.pid]
    assert [s["pid"] for s in scans["b"]["scans"]] == [b.pid]
    # one report per process, under its target; the other target counted nothing of it
    assert [r["target"] for r in reports_of(serve, a.pid)] == [str(alpha)]
    assert [r["target"] for r in reports_of(serve, b.pid)] == [str(beta)]
    # each process held at its _exit and scanned, as `run` does: the objects its
    # globals keep are still reachable (not leaked, as run would not fail them); those
    # whose pointers went with a freed block are lost, and counted as leaked
    leaked, reachable = "refcntd_leaked_objects_total", "refcntd_still_reachable_objects_total"
    assert series(after, leaked, "a") == {} and series(after, reachable, "a") == {"alpha": 5}
    assert series(after, leaked, "b") == {"beta": 4}
    assert series(after, reachable, "b") == {"beta": 5}
    (process,) = reports_of(serve, b.pid)[0]["processes"]
    kinds = {g["kind"]: len(g["instances"]) for g in process["groups"]}
    assert kinds == {"definitely lost": 4, "still reachable": 5}, kinds
    assert not [n for n in process["notes"] if "not scanned" in n], process["notes"]
    assert serve.log.count(f"pid={a.pid} ") == 1 and serve.log.count(f"pid={b.pid} ") == 1


def test_a_process_older_than_serve_and_a_killed_one(bpf, build, tmp_path):
    """One policy in every mode, notes per process: a process running before serve
    gets one report at its detach, named after its program, with its unknown gets and
    puts as one count; a process killed by SIGTERM is reported, not judged."""
    alpha, beta, spec = programs(build, tmp_path)
    old = Program(alpha, 0, 3)  # its 3 objects predate the probes
    try:
        with Serve(tmp_path, targets(alpha, beta, spec)) as serve:
            old.say("ops")  # a get and a put on each of them: never seen initialised
            old.say("more 2")  # made by a thread named "alpha:s": the first init seen
            killed = Program(beta, 1, 4)
            killed.proc.send_signal(signal.SIGTERM)
            killed.proc.wait(timeout=30)
            serve.wait_log(f"target=b pid={killed.pid} ")
            m = serve.scrape()
            assert serve.stop() == 0
    finally:
        old.kill()
    # the killed process: reported, not judged, not counted as leaks
    line = next(t for t in serve.log.splitlines() if f"pid={killed.pid} " in t)
    assert line.startswith("INFO ") and "not judged" in line, line
    (report,) = reports_of(serve, killed.pid)
    (process,) = report["processes"]
    assert process["leaked_objects"] == 4 and process["exit_status"] == "killed by SIGTERM"
    assert any("not judged" in n for n in process["notes"]), process["notes"]
    assert not series(m, "refcntd_leaked_objects_total", "b")
    assert metric(m, "refcntd_processes_reported_total", target="b") == 1
    # the older process: one report, at detach, in the words of the log line
    lines = [t for t in serve.log.splitlines() if f"pid={old.pid} " in t]
    assert len(lines) == 1 and "target=a " in lines[0], lines
    assert "2 objects still live at detach (not counted as leaks)" in lines[0], lines
    (report,) = reports_of(serve, old.pid)
    (process,) = report["processes"]
    assert report["leaked_objects"] == 0 and process["state"] == "live at detach"
    assert process["comm"] == alpha.name[:15], process["comm"]
    assert not [x for x in process["anomalies"] if x["kind"].startswith("unknown")]
    notes = report["tracing"]["notes"]
    assert "3 gets on objects never seen initialised" in " ".join(notes), notes
    # its own notes only: nothing of the killed process, nothing about JIT code
    text = json.dumps(report) + json.dumps(reports_of(serve, killed.pid))
    assert "orcexec" not in text and "not an ELF file" not in text
    killed_notes = reports_of(serve, killed.pid)[0]["tracing"]["notes"]
    assert not [n for n in killed_notes if "never seen initialised" in n], killed_notes


def gst_launch() -> str:
    """Debian's gst-launch-1.0: a failure where BPF tests must run, else a skip."""
    found = shutil.which("gst-launch-1.0")
    if found is None:
        if os.environ.get("REFCNTD_REQUIRE_BPF") == "1":
            pytest.fail("gst-launch-1.0 (gstreamer1.0-tools) is required")
        pytest.skip("gst-launch-1.0 (gstreamer1.0-tools) not installed")
    return found


def test_two_gstreamer_pipelines_under_two_targets(bpf, tmp_path):
    """The issue's setting: the bundled gstreamer spec probes libgstreamer and
    libgobject, which both programs map; two copies of gst-launch-1.0 (two programs:
    a target on /usr/bin would also count other users' pipelines on this host)."""
    progs = {}
    for name in ("gsta", "gstb"):
        progs[name] = tmp_path / name
        shutil.copy(gst_launch(), progs[name])
    config = "".join(f"  - name: {n}\n    path: {p}\n    spec: gstreamer\n"
                     "    age_threshold: 5s\n" for n, p in progs.items())
    pipeline = ["audiotestsrc", "is-live=true", "!", "fakesink"]
    with Serve(tmp_path, config) as serve:
        runs = {n: subprocess.Popen([str(p), "-e", *pipeline], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL) for n, p in progs.items()}
        try:
            time.sleep(17)  # past warm_up (10 s) and age_threshold (5 s)
            m = serve.scrape()
            scans = serve.leaks()["targets"]
            for proc in runs.values():
                proc.send_signal(signal.SIGINT)  # -e: an EOS, then a clean exit
                assert proc.wait(timeout=30) == 0
            for n, proc in runs.items():
                serve.wait_log(f"target={n} pid={proc.pid} ")
            after = serve.scrape()
        finally:
            for proc in runs.values():
                proc.kill()
                proc.wait()
        assert serve.stop() == 0
    for n, proc in runs.items():
        assert metric(m, "refcntd_traced_processes", target=n, binary=str(progs[n])) == 1
        assert [s["pid"] for s in scans[n]["scans"]] == [proc.pid]
        assert [r["target"] for r in reports_of(serve, proc.pid)] == [str(progs[n])]
        assert serve.log.count(f"pid={proc.pid} ") == 1
        # a healthy pipeline: its start-up objects (the registry) are no alert
        assert set(series(m, "refcntd_live_objects_older_than_threshold", n).values()) \
            == {0}, series(m, "refcntd_live_objects_older_than_threshold", n)
    # each target counts its own process's objects only: the same pipeline, the same
    # GObjects (a target counting both processes would show twice as many)
    live = [series(m, "refcntd_live_objects", n)["GObject"] for n in progs]
    assert live[0] == live[1] > 0, live
    assert series(after, "refcntd_leaked_objects_total", "gsta") == \
        series(after, "refcntd_leaked_objects_total", "gstb")


def test_leaks_at_exit_counted_by_class(bpf, tmp_path):
    """A real leaker through Debian's libgstreamer (python3's ctypes, 30 of 60 caps
    never unref'd, no pointer to them left), exiting under serve without G_SLICE: held
    at _exit and scanned as `run` is, its 30 caps are lost and counted by class, so an
    SRE's alert can tell caps from buffers; what GStreamer keeps in globals at exit
    (its registry) is still reachable and not counted as leaked."""
    python = tmp_path / "capsleak"
    shutil.copy(Path("/usr/bin/python3").resolve(), python)  # Debian's, not a shim
    env = {k: v for k, v in os.environ.items() if k != "G_SLICE"}
    with Serve(tmp_path, f"  - name: pyleak\n    path: {python}\n    spec: gstreamer\n") \
            as serve:
        proc = subprocess.run([str(python), str(FIXTURES / "capsleak.py"), "exit"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        serve.wait_log("target=pyleak pid=", 60)
        m = serve.scrape()
        assert serve.stop() == 0
    books = {int(line.split()[2], 16) for line in proc.stdout.splitlines()
             if line.startswith("leak GstCaps")}
    assert len(books) == 30, proc.stdout
    (report,) = [json.loads(p.read_text()) for p in serve.reports.glob("*.json")]
    (process,) = report["processes"]
    lost = {int(i["address"], 16) for g in process["groups"]
            if g.get("kind", "").endswith("lost") for i in g["instances"]}
    assert books <= lost, process["groups"]
    caps = [g for g in process["groups"] if g.get("class_name") == "GstCaps"
            and g.get("kind", "").endswith("lost")]
    assert {int(i["address"], 16) for g in caps for i in g["instances"]} == books
    # GStreamer's own caps (static caps of its registry) are alive too, and not lost
    assert [g for g in process["groups"] if g.get("class_name") == "GstCaps"
            and g.get("kind") == "still reachable"]
    by_class = "refcntd_leaked_objects_by_class_total"
    assert metric(m, by_class, target="pyleak", type="GstMiniObject", **{"class": "GstCaps"}) \
        == 30
    leaked = series(m, "refcntd_leaked_objects_total", "pyleak")
    assert leaked["GstMiniObject"] == len([a for g in process["groups"]
                                           if g["type"] == "GstMiniObject"
                                           and g.get("kind", "").endswith("lost")
                                           for a in g["instances"]])
    assert series(m, "refcntd_still_reachable_objects_total", "pyleak"), m
    assert f"{len(lost)} leaked objects, " in serve.log, serve.log


def test_two_targets_on_the_same_program_trace_each_process_once(bpf, build, tmp_path):
    """Two unscoped targets whose paths name one program (here a glob and the path
    itself): the first in the config traces it, the second says why it does not (an
    attach error, in the log and the metrics), so each process is held, scanned and
    reported once; once the first goes (a reload), the second takes the program."""
    alpha, _, spec = programs(build, tmp_path)
    both = (f"  - name: a\n    path: {alpha}\n    spec: {spec}\n"
            f"  - name: b\n    path: {alpha.parent}/scoped_alph*\n    spec: {spec}\n")
    with Serve(tmp_path, both) as serve:
        assert f"target=b binary={alpha} not attached: already traced by target a" in serve.log
        first = Program(alpha, 1, 2)
        first.exit()
        serve.wait_log(f"target=a pid={first.pid} ")
        m = serve.scrape()
        serve.write_config(f"  - name: b\n    path: {alpha.parent}/scoped_alph*\n"
                           f"    spec: {spec}\n")
        serve.proc.send_signal(signal.SIGHUP)
        serve.wait_log(f"target=b binary={alpha} attached")
        second = Program(alpha, 1, 2)
        second.exit()
        serve.wait_log(f"target=b pid={second.pid} ")
        assert serve.stop() == 0
    assert [r["target"] for r in reports_of(serve, first.pid)] == [str(alpha)]
    assert serve.log.count(f"pid={first.pid} ") == 1 and f"target=b pid={first.pid}" \
        not in serve.log
    assert metric(m, "refcntd_target_attach_errors", target="b") == 1
    assert metric(m, "refcntd_processes_reported_total", target="a") == 1
    assert metric(m, "refcntd_processes_reported_total", target="b") == 0
    assert len(reports_of(serve, second.pid)) == 1


def _stack_owners(pid: int) -> list[int]:
    """The process (tgid) owning each entry of serve's proc_stacks maps (bpftool)."""
    owners = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-map":
            continue
        info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        map_id = next(line.split()[1] for line in info.splitlines()
                      if line.startswith("map_id"))
        shown = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "id", map_id],
                                          capture_output=True, text=True, check=True).stdout)
        if shown.get("name") != "proc_stacks":
            continue
        dump = json.loads(subprocess.run(["bpftool", "-j", "map", "dump", "id", map_id],
                                         capture_output=True, text=True, check=True).stdout)
        owners += [e["formatted"]["key"]["tgid"] for e in dump]
    return owners


def test_another_programs_process_leaves_no_stack(bpf, tmp_path):
    """A target on a copy of gst-launch-1.0, the gstreamer spec on libgstreamer and
    libgobject, which other programs map too: Debian's own gst-launch-1.0 is then not
    traced, and its inits must not walk and keep stacks either.  They did: owned by a
    process never reported, never freed, so one GLib test beside the gst soak filled
    serve's stack store for good and every pipeline after it lost its stacks
    (benchmarks/results/gst-soak.md)."""
    mine = tmp_path / "gst-launch-1.0"
    shutil.copy(gst_launch(), mine)
    config = f"  - name: gst\n    path: {mine}\n    spec: gstreamer\n"
    pipeline = ["audiotestsrc", "num-buffers=300", "!", "audioconvert", "!", "fakesink"]
    with Serve(tmp_path, config) as serve:
        other = subprocess.run([gst_launch(), *pipeline], capture_output=True, timeout=60)
        assert other.returncode == 0, other.stderr
        time.sleep(1)  # its exit seen
        owners_after_other = _stack_owners(serve.proc.pid)
        traced = subprocess.Popen([str(mine), *pipeline], stdout=subprocess.DEVNULL)
        try:
            serve.wait_log(f"target=gst pid={traced.pid} ")
        finally:
            traced.kill()
            traced.wait()
        assert serve.stop() == 0
    assert owners_after_other == [], owners_after_other
    (report,) = reports_of(serve, traced.pid)  # the target's own stacks still recorded
    assert report["tracing"]["complete"], report["tracing"]
    assert all(g["stack"] for p in report["processes"] for g in p["groups"])


def test_get_leaks_sets_aside_the_gstobjects_gstreamer_flags(bpf, tmp_path):
    """A program target scans at exit, so the spec's check probes on gst_object_* are
    not planned: GET /leaks reads GstObject's may-be-leaked flag in its stop and sets
    the objects flagged (pad templates, the system clock) aside as those probes did.
    They leave the live GObjects and join the kernel note; a second GET finds none."""
    prog = tmp_path / "gstc"
    shutil.copy(gst_launch(), prog)
    pipeline = ["audiotestsrc", "is-live=true", "!", "audioconvert", "!", "fakesink"]
    with Serve(tmp_path, f"  - name: gstc\n    path: {prog}\n    spec: gstreamer\n") as serve:
        run = subprocess.Popen([str(prog), *pipeline], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)
            before = serve.scrape()
            first = serve.leaks()["targets"]["gstc"]["scans"]
            after = serve.scrape()
            serve.leaks()
            again = serve.scrape()
        finally:
            run.kill()
            run.wait()
        assert serve.stop() == 0
    assert [s["pid"] for s in first] == [run.pid]
    assert not [p for p in serve.log.splitlines() if "probe not installed" in p]

    def noted(m: dict) -> float:
        return metric(m, "refcntd_kernel_notes_total", target="gstc",
                      note="may_be_leaked") or 0.0

    def live(m: dict) -> float:
        return series(m, "refcntd_live_objects", "gstc")["GObject"]
    aside = noted(after) - noted(before)
    assert aside >= 2, (noted(before), noted(after))  # a pad template per pad at least
    assert live(before) - live(after) == aside, (live(before), live(after))
    assert (noted(again), live(again)) == (noted(after), live(after))
