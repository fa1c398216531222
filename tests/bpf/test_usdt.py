"""USDT probes gated by semaphores that the kernel owns (uprobe ref_ctr_offset)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, functions, leak_summary, refcntd
from test_attach import Attached

from refcntd.binary.elf import ElfImage
from refcntd.binary.sdt import sdt_probes, semaphore_file_offset

WIDGET_LEAKS = {"widget": [1, 2]}
PROBES = ("widget:init", "widget:ref", "widget:unref", "widget:destroy")


def semaphores(pid: int, module: Path) -> dict[str, int | None]:
    """Each widget probe's semaphore in a live process, read from /proc/PID/mem."""
    image = ElfImage(module)
    st = os.stat(module)
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    out: dict[str, int | None] = {}
    for probe in sdt_probes(image):
        offset = semaphore_file_offset(image, probe)
        out[probe.full_name] = None
        for line in maps:
            f = line.split(None, 5)
            start, end = (int(x, 16) for x in f[0].split("-"))
            if int(f[4]) == st.st_ino and "w" in f[1] and \
                    int(f[2], 16) <= offset < int(f[2], 16) + end - start:
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    mem.seek(start + offset - int(f[2], 16))
                    out[probe.full_name] = int.from_bytes(mem.read(2), "little")
    return out


def all_raised(values: dict[str, int | None]) -> bool:
    return all(values[p] is not None and values[p] >= 1 for p in PROBES)


def all_zero(values: dict[str, int | None]) -> bool:
    return all(values[p] == 0 for p in PROBES)


class Holder:
    """widgetmain hold: waits before and after its work, so it can be inspected."""

    def __init__(self, exe: Path) -> None:
        self.proc = subprocess.Popen([str(exe), "hold"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def work(self) -> int:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        guarded = int(self.proc.stdout.readline().split()[1])
        assert self.proc.stdout.readline().strip() == "done"
        return guarded

    def finish(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("x\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("shared", [False, True], ids=["exe", "lib"])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_usdt_report_is_exact(bpf, build, tmp_path, opt, shared):
    exe, module = build.usdt_program(opt, shared)
    spec = "example-usdt"
    if shared:
        spec = str(tmp_path / "spec.yaml")
        text = (ROOT / "configs/specs/example-usdt.yaml").read_text()
        Path(spec).write_text(text.replace("roles:\n", f"library: {module}\nroles:\n"))
    result = refcntd(["run", "--spec", spec, "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert result.stdout.strip() == "guarded 8"
    (process,) = result.report["processes"]
    assert leak_summary(process) == WIDGET_LEAKS
    for group in process["groups"]:
        assert functions(group)[:3] == ["widget_new", "work", "main"]
    assert result.report["tracing"]["complete"]




def test_semaphores_before_during_after_detach(bpf, build, tmp_path):
    exe, lib = build.usdt_program("-O2", shared=True)
    early = Holder(exe)  # maps the library before the attach
    late = None
    try:
        assert all_zero(semaphores(early.proc.pid, lib))
        with Attached(["--binary", str(lib), "--spec", "example-usdt"],
                      tmp_path / "a.json") as att:
            assert all_raised(semaphores(early.proc.pid, lib))
            late = Holder(exe)  # started while attached
            assert all_raised(semaphores(late.proc.pid, lib))
            check = refcntd(["check", "--binary", str(lib), "--spec", "example-usdt",
                             "--pid", str(late.proc.pid)])
            assert check.stdout.count(f"semaphore in pid {late.proc.pid}: 1") == 4
            assert early.work() == 8 and late.work() == 8
            code, _, report = att.stop()
        assert code == 0
        assert all_zero(semaphores(early.proc.pid, lib))
        assert all_zero(semaphores(late.proc.pid, lib))
        live = [p for p in report["processes"] if p["state"] == "live at detach"]
        assert sorted(p["pid"] for p in live) == sorted([early.proc.pid, late.proc.pid])
        assert all(leak_summary(p) == WIDGET_LEAKS for p in live)
    finally:
        early.kill()
        if late:
            late.kill()


def test_semaphores_restored_when_refcntd_is_killed(bpf, build, tmp_path):
    exe, lib = build.usdt_program("-O2", shared=True)
    holder = Holder(exe)
    try:
        with Attached(["--binary", str(lib), "--spec", "example-usdt"],
                      tmp_path / "a.json") as att:
            assert all_raised(semaphores(holder.proc.pid, lib))
            att.proc.send_signal(signal.SIGKILL)
            att.proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not all_zero(semaphores(holder.proc.pid, lib)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all_zero(semaphores(holder.proc.pid, lib))
        assert holder.work() == 0
    finally:
        holder.kill()


def test_seed001_mmap_mprotect_split_keeps_the_semaphore_balanced(bpf, build, tmp_path):
    from conftest import FIXTURES, cc
    _, lib = build.usdt_program("-O2", shared=True)
    mapper = cc(tmp_path / "mapper", [FIXTURES / "mapper.c"], ["-O2", "-ldl"])
    proc = subprocess.Popen([str(mapper), str(lib)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def step(expect: str) -> None:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == expect

    try:
        assert proc.stdout.readline().strip() == "ready"
        with Attached(["--binary", str(lib), "--spec", "example-usdt"],
                      tmp_path / "a.json") as att:
            step("opened")  # ld.so maps the library while attached
            assert all_raised(semaphores(proc.pid, lib))
            step("split")  # mprotect splits the data mapping and joins it again
            assert all_raised(semaphores(proc.pid, lib))
            code, _, _ = att.stop()
        assert code == 0
        assert all_zero(semaphores(proc.pid, lib))
    finally:
        proc.kill()
        proc.wait()


def test_function_and_usdt_probes_on_one_binary(bpf, build, tmp_path):
    """init by a return probe on widget_new, get/put by USDT: no probe disturbs another."""
    exe, _ = build.usdt_program("-O2")
    spec = tmp_path / "mixed.yaml"
    spec.write_text("""version: 1
name: mixed
roles:
  init: {functions: [widget_new], object: return, type: {name: widget}}
  get: {usdt: "widget:ref", object: arg1}
  put: {usdt: "widget:unref", object: arg1}
  delete: {usdt: "widget:destroy", object: arg1}
""")
    result = refcntd(["run", "--spec", str(spec), "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert leak_summary(process) == WIDGET_LEAKS
    # init's semaphore is not raised by this spec: 3 fewer guarded branches
    assert result.stdout.strip() == "guarded 5"


def test_two_instances_trace_the_same_probes(bpf, build, tmp_path):
    exe, lib = build.usdt_program("-O2", shared=True)
    args = ["--binary", str(lib), "--spec", "example-usdt"]
    holder = None
    with Attached(args, tmp_path / "a.json") as one, Attached(args, tmp_path / "b.json") as two:
        first = subprocess.run([str(exe)], capture_output=True, text=True)
        one.proc.send_signal(signal.SIGKILL)
        one.proc.wait(timeout=10)
        second = subprocess.run([str(exe)], capture_output=True, text=True)
        holder = Holder(exe)
        assert all_raised(semaphores(holder.proc.pid, lib))  # two still holds them
        code, _, report = two.stop()
    try:
        assert all_zero(semaphores(holder.proc.pid, lib))
    finally:
        holder.kill()
    assert code == 0 and first.stdout.strip() == second.stdout.strip() == "guarded 8"
    exited = [p for p in report["processes"] if p["state"] == "exited"]
    assert len(exited) == 2 and all(leak_summary(p) == WIDGET_LEAKS for p in exited)


