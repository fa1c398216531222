"""Reliability and safety: the target is never harmed, nothing is left behind,
nothing is lost silently, and bad input never produces a traceback.

Long tests take a smaller size in CI; REFCNTD_FULL=1 runs the full size
(see RELIABILITY.md)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, cc, leak_summary, refcntd
from test_attach import Attached
from test_run import PERFLIKE_LEAKS, assert_perflike_truth, lib_spec

FULL = os.environ.get("REFCNTD_FULL") == "1"


def run_plain(cmd: list[str]) -> tuple[int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout


# ---- the target is never harmed ----------------------------------------------------
def harmless_cases(build: object, tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    lib = build.stub_lib("O2")
    plugin = cc(tmp / "p" / "libplugin.so", [FIXTURES / "plugin.c"],
                ["-O2", "-fPIC", "-shared", f"-L{lib.parent}", "-lrefcnt",
                 f"-Wl,-rpath,{lib.parent}"])
    spec = ["--spec", str(lib_spec(tmp, lib))]
    iterations = "16000"  # 8 threads x 16000 x 4 objects x (get + put) = 1.02M operations
    return {
        "8 threads, 1M operations": ([], [str(build.program(
            "mthread", [FIXTURES / "mthread.c"], "O0", flags=["-pthread"])), iterations]),
        "fork + exec": (spec, [str(build.program("forkexec", [FIXTURES / "forkexec.c"], "O2",
                                                   shared_stubs=True)),
                               str(build.perflike("O2", shared_stubs=True))]),
        "dlopen + dlclose": (spec, [str(build.program("dlhost", [FIXTURES / "dlhost.c"], "O2",
                                                        flags=["-ldl"])), str(plugin)]),
        "exit from a non-main thread": ([], [str(build.program(
            "threadexit", [FIXTURES / "threadexit.c"], "O2", flags=["-pthread"]))]),
    }


@pytest.mark.parametrize("case", ["8 threads, 1M operations", "fork + exec", "dlopen + dlclose",
                                  "exit from a non-main thread"])
def test_target_output_and_status_unchanged(bpf, build, tmp_path, case):
    spec, cmd = harmless_cases(build, tmp_path)[case]
    plain_status, plain_out = run_plain(cmd)
    traced = refcntd(["run", *spec, "--exitcode", "99", "--", *cmd], tmp_path / "r.json")
    assert traced.returncode in (99, plain_status), traced.stderr
    assert traced.stdout == plain_out
    assert traced.report["command_status"] == plain_status
    assert traced.report["tracing"]["complete"], traced.report["tracing"]
    if case == "exit from a non-main thread":
        (process,) = traced.report["processes"]
        assert process["exit_status"] == "exit 7"
        assert leak_summary(process) == {"kept": [2]}


# ---- nothing left behind ------------------------------------------------------------
def bpf_objects() -> tuple[set[str], set[str]]:
    """Names of loaded BPF programs and maps (bpftool)."""
    progs = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True,
                                      text=True, check=True).stdout)
    maps = json.loads(subprocess.run(["bpftool", "-j", "map", "show"], capture_output=True,
                                     text=True, check=True).stdout)
    return ({p.get("name", "") for p in progs} - {""}, {m.get("name", "") for m in maps} - {""})


REFCNTD_PROGS = {"on_probe", "on_unwind", "on_body", "on_unwind_more", "on_ldso"}


def settled_bpf_objects(timeout: float = 20) -> tuple[set[str], set[str]]:
    """bpf_objects() once an earlier test's refcntd is gone from the kernel: its programs
    and maps are freed after it exits (deferred; its maps after its programs: a "before"
    read between the two once held the previous run's twelve maps), and must not count
    as "before".  Settled: no refcntd program, and the same twice 0.5 s apart."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        objects = bpf_objects()
        if (not objects[0] & REFCNTD_PROGS and objects == last) \
                or time.monotonic() > deadline:
            return objects
        last = objects
        time.sleep(0.5)


def probe_bytes(pid: int, module: Path, offsets: list[int]) -> list[int]:
    """The byte at each probed file offset, as mapped in a live process (0xcc: a breakpoint)."""
    st = os.stat(module)
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        f = line.split(None, 5)
        if len(f) == 6 and int(f[4]) == st.st_ino and "x" in f[1]:
            start, end = (int(x, 16) for x in f[0].split("-"))
            base = int(f[2], 16)
            with open(f"/proc/{pid}/mem", "rb") as mem:
                for off in offsets:
                    if base <= off < base + end - start:
                        mem.seek(start + off - base)
                        out.append(mem.read(1)[0])
    return out


@pytest.mark.serial  # compares every loaded BPF program and map, and uprobe_events
@pytest.mark.parametrize("how", ["normal", "SIGTERM", "SIGINT", "SIGKILL"])
def test_nothing_left_behind(bpf, build, tmp_path, how):
    from refcntd.binary.plan import build_plan
    from refcntd.inputs.spec import load_spec
    exe, lib = build.usdt_program("-O2", shared=True)
    plan = build_plan(load_spec("example-usdt"), str(lib))
    offsets = [s.file_offset for s in plan.sites]
    original = [Path(lib).read_bytes()[o] for o in offsets]
    events = Path("/sys/kernel/tracing/uprobe_events").read_text()
    progs_before, maps_before = settled_bpf_objects()
    from test_usdt import Holder, all_raised, all_zero, semaphores
    holder = Holder(exe)
    try:
        if how == "normal":  # run: refcntd exits on its own when its command does
            spec = tmp_path / "usdt-lib.yaml"
            spec.write_text((ROOT / "configs/specs/example-usdt.yaml").read_text()
                            .replace("roles:\n", f"library: {lib}\nroles:\n"))
            result = refcntd(["run", "--spec", str(spec), "--", str(exe)])
            assert result.returncode == 23, result.stderr
        else:
            with Attached(["--binary", str(lib), "--spec", "example-usdt"],
                          tmp_path / "a.json") as att:
                assert all_raised(semaphores(holder.proc.pid, lib))
                assert probe_bytes(holder.proc.pid, lib, offsets) == [0xCC] * len(offsets)
                att.proc.send_signal(getattr(signal, how))
                att.proc.wait(timeout=30)
                assert (att.proc.returncode == 0) == (how != "SIGKILL")
        deadline = time.monotonic() + 20  # multi-uprobe links are freed after an SRCU wait
        while time.monotonic() < deadline and bpf_objects() != (progs_before, maps_before):
            time.sleep(0.1)
        assert probe_bytes(holder.proc.pid, lib, offsets) == original
        assert all_zero(semaphores(holder.proc.pid, lib))
        assert Path("/sys/kernel/tracing/uprobe_events").read_text() == events
        assert bpf_objects() == (progs_before, maps_before)
        assert holder.work() == 0  # guarded code no longer runs
    finally:
        holder.kill()


# ---- load ---------------------------------------------------------------------------
def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))


def test_many_short_processes_each_reported_exactly_once(bpf, build, tmp_path):
    count = 1000 if FULL else 200
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    with Attached(["--binary", str(lib)], tmp_path / "a.json") as att:
        time.sleep(0.5)
        baseline = rss_kib(att.proc.pid)
        subprocess.run(f"seq {count} | xargs -P 4 -I{{}} {perflike} 10 > /dev/null",
                       shell=True, check=True)
        time.sleep(2)
        after = rss_kib(att.proc.pid)
        code, out, report = att.stop()
    assert code == (0 if report["tracing"]["complete"] else 24)
    exited = [p for p in report["processes"] if p["state"] == "exited"]
    assert len(exited) == count
    assert len({p["pid"] for p in exited}) == count  # each exactly once
    for process in exited:  # objects, types and counts exact in every report
        assert leak_summary(process) == dict(PERFLIKE_LEAKS, map=[1, 1, 1, 1])
    lost = report["tracing"]["lost"]
    assert lost == {}, lost  # no event and no stack lost: the stack store is content-addressed
    assert report["tracing"]["complete"]
    assert code == 0
    for process in exited:  # every object has its allocation stack, down to main
        for group in process["groups"]:
            assert "main" in [f.get("function") for f in group["stack"]], group
    print(f"\n{count} processes, {len(exited)} reports, lost: {lost}, "
          f"RSS {baseline} -> {after} KiB")
    assert after - baseline < 40 * 1024, (baseline, after)  # KiB: no per-process growth


# ---- capacity -----------------------------------------------------------------------
def test_object_map_overflow_is_counted_and_tracked_objects_stay_exact(bpf, build, tmp_path):
    exe = build.program("manygets", [FIXTURES / "churn.c"], "O2")  # holds N, releases all
    live = build.program("stacks", [FIXTURES / "stacks.c"], "O2")
    full = refcntd(["run", "--max-objects", "64", "--", str(exe), "300"], tmp_path / "a.json")
    assert full.returncode == 24  # no leak, but incomplete: never a clean result
    assert full.report["tracing"]["lost"] == {"inits not recorded: object map full": 236}
    assert full.report["leaked_objects"] == 0  # no tracked object reported wrongly
    leaks = refcntd(["run", "--max-objects", "16", "--", str(live), "40"], tmp_path / "b.json")
    assert leaks.returncode == 23
    assert leaks.report["tracing"]["lost"] == {"inits not recorded: object map full": 24}
    (process,) = leaks.report["processes"]
    assert process["leaked_objects"] == 16 and leak_summary(process) == {"o": [1] * 16}


def test_stack_store_overflow_is_counted(bpf, build, tmp_path):
    exe = build.program("stacks", [FIXTURES / "stacks.c"], "O2")
    result = refcntd(["run", "--max-stacks", "8", "--", str(exe), "40"], tmp_path / "r.json")
    assert result.returncode == 23
    lost = result.report["tracing"]["lost"]
    stack_losses = sum(n for reason, n in lost.items() if "stack" in reason)
    assert stack_losses >= 32, lost  # at most 8 of 40 distinct stacks fit
    (process,) = result.report["processes"]
    assert process["leaked_objects"] == 40  # every object still reported, with a count
    ok = refcntd(["run", "--", str(exe), "40"], tmp_path / "s.json")
    assert ok.report["tracing"]["complete"]
    assert len(ok.report["processes"][0]["groups"]) == 40  # 40 distinct stacks


# ---- pid and address reuse -----------------------------------------------------------
def test_address_reuse_is_a_new_object(bpf, build, tmp_path):
    exe = build.program("reuse", [FIXTURES / "reuse.c"], "O2")
    result = refcntd(["run", "--", str(exe)], tmp_path / "r.json")
    assert result.stdout.strip() == "reused 1"  # glibc gave the same address back
    (process,) = result.report["processes"]
    assert leak_summary(process) == {"second": [2]}
    assert process["anomalies"] == [] and result.report["tracing"]["complete"]


@pytest.mark.serial  # steers the next pid: another worker's forks would take it
def test_pid_reuse_never_mixes_records(bpf, build, tmp_path):
    """Two processes with the same pid, one after the other: two separate reports."""
    lib = build.stub_lib("O2")
    first = build.program("short-lib", [FIXTURES / "short.c"], "O2", shared_stubs=True)
    second = build.perflike("O2", shared_stubs=True)
    last_pid = Path("/proc/sys/kernel/ns_last_pid")
    with Attached(["--binary", str(lib)], tmp_path / "a.json") as att:
        one = subprocess.Popen([str(first)])
        assert one.wait() == 3
        for _ in range(50):  # ask the kernel to hand out the same pid again
            last_pid.write_text(str(one.pid - 1))
            two = subprocess.Popen([str(second)], stdout=subprocess.DEVNULL)
            assert two.wait() == 0
            if two.pid == one.pid:
                break
        else:
            pytest.fail("could not make the kernel reuse the pid")
        time.sleep(0.5)
        code, _, report = att.stop()
    assert code == 0
    same = [p for p in report["processes"] if p["pid"] == one.pid]
    assert len(same) == 2, same
    blip, perf = sorted(same, key=lambda p: "blip" not in leak_summary(p))
    assert leak_summary(blip) == {"blip": [1]} and blip["exit_status"] == "exit 3"
    assert_perflike_truth(perf)




# ---- concurrency ---------------------------------------------------------------------
def test_two_instances_on_function_probes(bpf, build, tmp_path):
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    args = ["--binary", str(lib)]
    with Attached(args, tmp_path / "a.json") as one, Attached(args, tmp_path / "b.json") as two:
        first = subprocess.run([str(perflike)], capture_output=True)
        code_one, _, report_one = one.stop()
        killer = Attached(args, tmp_path / "c.json")
        killer.proc.send_signal(signal.SIGKILL)  # a third instance dies mid-run
        killer.proc.wait(timeout=30)
        second = subprocess.run([str(perflike)], capture_output=True)
        code_two, _, report_two = two.stop()
    assert first.returncode == second.returncode == 0 and code_one == code_two == 0
    assert [p["pid"] for p in report_one["processes"]] == [first_pid(report_one)]
    exited_two = [p for p in report_two["processes"] if p["state"] == "exited"]
    assert len(exited_two) == 2
    for process in [*report_one["processes"], *exited_two]:
        assert_perflike_truth(process)


def first_pid(report: dict) -> int:
    return report["processes"][0]["pid"]
