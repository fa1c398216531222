"""Symbols where the distribution keeps them: separate debug files, debuginfod.

The executable is stripped of every symbol (its static functions are named
only in the split-off debug file); the stubs live in a shared library so
the probes do not need the executable's symbols.

Runs use --no-leak-kinds: the subject here is symbolization; what the fixtures leak is
often still reachable at exit (kept in a global, or a pointer left on a stack), which
the default lists without failing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import FIXTURES, cc, functions, leak_summary, refcntd
from test_run import lib_spec

from refcntd.binary.elf import read_build_id
from refcntd.symbolize.debugfiles import DebugFileFinder
from refcntd.symbolize.modules import ModuleSymbols

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

CHAIN = ["__refcnt__init", "gadget_create", "assemble_parts", "build_all", "main"]


def split_debug(exe: Path, out_dir: Path) -> tuple[Path, Path]:
    """(stripped copy of `exe`, its debug file), the way Debian's dh_strip splits them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stripped, debug = out_dir / exe.name, out_dir / f"{exe.name}.debug"
    shutil.copy(exe, stripped)
    subprocess.run(["objcopy", "--only-keep-debug", str(stripped), str(debug)], check=True)
    subprocess.run(["objcopy", "--strip-all", "--add-gnu-debuglink", str(debug), str(stripped)],
                   check=True, cwd=out_dir)
    return stripped, debug


@pytest.fixture()
def stripped(build, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(program, its debug file moved out of every place a debuglink would find it, spec)."""
    exe = build.program("debugsplit", [FIXTURES / "debugsplit.c"], "O2", shared_stubs=True)
    prog, debug = split_debug(exe, tmp_path / "bin")
    away = tmp_path / "elsewhere" / debug.name
    away.parent.mkdir()
    debug.rename(away)
    assert read_build_id(prog) == read_build_id(away) is not None
    bare = ModuleSymbols.load(str(prog), DebugFileFinder(debug_dirs=(), debuginfod=None))
    assert bare.names == [] and bare.lines_path is None  # nothing left to name the code
    return prog, away, lib_spec(tmp_path, build.stub_lib("O2"))


def run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}
    env.update({"REFCNTD_DEBUG_DIRS": "", "REFCNTD_CACHE": str(tmp_path / "cache"), **extra})
    return env


def assert_named_with_lines(result) -> None:
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    assert leak_summary(process) == {"gadget": [1, 1]}
    assert process["groups"]  # gcc unrolls the loop: one stack per call site
    for group in process["groups"]:
        assert functions(group)[:5] == CHAIN, group["stack"]
        for frame in group["stack"][1:5]:
            assert frame["file"].endswith("debugsplit.c") and frame["line"] > 0, frame
    assert "gadget_create+0x" in result.stdout + result.stderr
    assert "debugsplit.c:" in result.stdout + result.stderr


def test_debug_file_found_through_build_id_directory(bpf, stripped, tmp_path):
    prog, debug, spec = stripped
    build_id = read_build_id(prog)
    root = tmp_path / "debugroot"
    target = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    target.parent.mkdir(parents=True)
    shutil.copy(debug, target)
    env = run_env(tmp_path, REFCNTD_DEBUG_DIRS=str(root))
    result = refcntd([*RUN, "--spec", str(spec), "--", str(prog)], tmp_path / "r.json", env=env)
    assert_named_with_lines(result)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_served(url: str, proc: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"debuginfod did not serve {url} within {timeout_s} s")


@pytest.fixture()
def debuginfod_server(tmp_path: Path):
    """Debian's debuginfod serving one directory on loopback: (dir, base URL, process)."""
    served = tmp_path / "served"
    served.mkdir()
    port = free_port()
    proc = subprocess.Popen(["debuginfod", "-F", str(served), "-p", str(port), "-d",
                             str(tmp_path / "debuginfod.sqlite"), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield served, f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_debug_file_found_through_debuginfod(bpf, stripped, debuginfod_server, tmp_path):
    prog, debug, spec = stripped
    served, url, server = debuginfod_server
    shutil.copy(debug, served / debug.name)
    build_id = read_build_id(prog)
    wait_served(f"{url}/buildid/{build_id}/debuginfo", server)
    env = run_env(tmp_path, DEBUGINFOD_URLS=url)
    result = refcntd([*RUN, "--spec", str(spec), "--", str(prog)], tmp_path / "r.json", env=env)
    assert_named_with_lines(result)
    assert (tmp_path / "cache" / "debuginfod" / build_id / "debuginfo").is_file()


@pytest.mark.parametrize("unwind,how", [("cfi", "rwx"), ("cfi", "wx"), ("fp", "rwx")])
def test_jit_frame_named_through_perf_map(bpf, build, tmp_path, unwind, how):
    """A frame in anonymous executable memory is named from /tmp/perf-PID.map, and the
    walk goes on past it to main: with the CFI unwinder (the default; stepped by frame
    pointers there), for a buffer mmap'ed executable and for one mprotect'ed executable
    after it was written (W^X JITs), and with the kernel's walk (REFCNTD_UNWIND=fp)."""
    exe = build.program("jitmap", [FIXTURES / "jitmap.c"], "O2")
    env = dict(os.environ, **({"REFCNTD_UNWIND": "fp"} if unwind == "fp" else {}))
    result = refcntd([*RUN, "--", str(exe), how], tmp_path / "r.json", env=env)
    (process,) = result.report["processes"]
    Path(f"/tmp/perf-{process['pid']}.map").unlink()
    assert result.returncode == 23, result.stderr
    assert leak_summary(process) == {"widget": [2]}
    (group,) = process["groups"]
    assert functions(group)[:4] == ["__refcnt__init", "make_widget",
                                    "jitted_trampoline [JIT] tier-1", "main"], group["stack"]
    assert group["stack"][2]["module"] == f"/tmp/perf-{process['pid']}.map"


def test_library_in_another_mount_namespace(bpf, build, tmp_path):
    """A plugin visible only inside the process's mount namespace, dlclosed before
    exit: read through the process's root, held from when it was seen (the shell
    keeps the namespace, and so its bind mount, alive a little longer)."""
    lib = build.stub_lib("O2")
    private, mountpoint = tmp_path / "private", tmp_path / "ns"
    cc(private / "libplugin.so", [FIXTURES / "plugin.c"],
       ["-O2", "-fno-omit-frame-pointer", "-fPIC", "-shared", f"-L{lib.parent}", "-lrefcnt",
        f"-Wl,-rpath,{lib.parent}"])
    mountpoint.mkdir()  # empty here; the plugin's folder is bound on it in the namespace
    host = build.program("dlhost", [FIXTURES / "dlhost.c"], "O2", flags=["-ldl"])
    script = f"mount --bind {private} {mountpoint} && {host} {mountpoint}/libplugin.so; sleep 1"
    result = refcntd([*RUN, "--spec", str(lib_spec(tmp_path, lib)), "--", "unshare", "-m",
                      "sh", "-c", script], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    (process,) = [p for p in result.report["processes"] if p["groups"]]
    assert process["command"][-1] == f"{mountpoint}/libplugin.so"
    assert leak_summary(process) == {"widget": [2]}
    (group,) = process["groups"]
    assert functions(group)[:4] == ["__refcnt__init", "widget_new", "plugin_run", "main"]
    module = group["stack"][1]["module"]
    assert module == f"/proc/{process['pid']}/root{mountpoint}/libplugin.so", group["stack"]
    assert group["stack"][1]["file"].endswith("plugin.c")


def test_roots_of_processes_whose_exit_is_never_seen_are_closed(bpf):
    """A process seen exec'ing in another mount namespace has its root held open (its
    libraries are read through it); when no exit of it ever comes (system-wide, never
    traced), the sweep closes it once the process has been gone for two sweeps: the
    hour's soak kept 12 such fds from a test run beside it."""
    from refcntd.symbolize.symbolizer import BuildIdIndex
    index = BuildIdIndex()
    fds = len(os.listdir("/proc/self/fd"))
    child = subprocess.Popen(["unshare", "-m", "sleep", "0.5"])
    time.sleep(0.2)  # unshare has exec'd sleep in its namespace
    index.watch_process(child.pid)
    index.inherit_root(1 << 23, child.pid)  # a fork whose exit is not seen (above PID_MAX_LIMIT)
    assert len(index._roots) == 2 and len(os.listdir("/proc/self/fd")) == fds + 2
    index.forget_gone()
    assert len(index._roots) == 2  # the fork's pid cannot exist: gone at its first sweep
    child.wait(timeout=10)
    index.forget_gone()
    assert len(index._roots) == 1  # the fork's, at its second; the child's is kept one more
    index.forget_gone()
    assert len(index._roots) == 0 and len(os.listdir("/proc/self/fd")) == fds
