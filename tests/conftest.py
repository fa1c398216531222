"""Shared test machinery: building C fixtures and running refcntd for real.

BPF tests need root, bcc and kernel headers.  Without them they skip, except
under REFCNTD_REQUIRE_BPF=1 (CI), where they fail: no silent skips.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from otheruser import OtherUserPython

# The culprit rules' own tests check the inference's logic on fixtures: calibration (which
# rules may name a function, measured on real mutants: refcntd/analysis/calibration.py)
# is off for them, in this process and the refcntd it starts, and tested on its own
# (tests/unit/test_calibration.py, tests/bpf/test_culprit_holders.py: shipped_table_env).
os.environ["REFCNTD_CALIBRATION"] = "off"


def shipped_table_env() -> dict[str, str]:
    """The environment of a refcntd that judges with the calibration it ships."""
    return {k: v for k, v in os.environ.items() if k != "REFCNTD_CALIBRATION"}

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REFCNTD = [sys.executable, "-m", "refcntd"]
STUB_VARIANTS = {"O0": ["-O0"], "O2": ["-O2"], "O2fp": ["-O2", "-fno-omit-frame-pointer"]}


def bpf_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc (python3-bpfcc) not importable"
    try:
        from refcntd.kernel.kheaders import find_kernel_source
        find_kernel_source()
    except Exception as err:  # noqa: BLE001 - report any reason
        return f"no kernel headers: {err}"
    return None


@pytest.fixture(scope="session")
def bpf() -> None:
    """Depend on this fixture in every test that loads BPF."""
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("REFCNTD_REQUIRE_BPF") == "1":
        pytest.fail(f"BPF required (REFCNTD_REQUIRE_BPF=1) but unavailable: {reason}")
    pytest.skip(f"BPF unavailable: {reason}")


def pkg_config_flags(package: str) -> list[str]:
    """Compile and link flags of a library the fixtures build against (installed by
    scripts/setup.sh): a failure names the package, never a skip."""
    try:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", package], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.fail(f"pkg-config {package} failed (libglib2.0-dev, scripts/setup.sh): {err}")
    return out.split()


def start_hanging(exe: Path, env: dict[str, str] | None = None
                  ) -> tuple[subprocess.Popen[str], str]:
    """A fixture started with `hang`, once it printed READY: the process and what it
    printed (its objects' addresses); the caller kills it."""
    proc = subprocess.Popen([str(exe), "hang"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "READY\n":
        lines.append(proc.stdout.readline())
        assert lines[-1], "the fixture ended early"
    return proc, "".join(lines)


def cc(out: Path, sources: list[Path], flags: list[str]) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["gcc", "-g", f"-I{EXAMPLES}", "-o", str(out), *map(str, sources), *flags]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


@dataclass
class Build:
    """Compiles fixtures into one directory per test session."""

    root: Path

    def stub_lib(self, variant: str) -> Path:
        out = self.root / variant / "librefcnt.so"
        if not out.exists():
            cc(out, [EXAMPLES / "refcnt.c"], [*STUB_VARIANTS[variant], "-fPIC", "-shared"])
        return out

    def program(self, name: str, sources: list[Path], variant: str = "O2fp",
                shared_stubs: bool = False, flags: list[str] = ()) -> Path:
        """`sources` with the stub set built at `variant` (linked in, or as librefcnt.so)."""
        suffix = "-lib" if shared_stubs else ""
        out = self.root / variant / f"{name}{suffix}"
        if out.exists():
            return out
        if shared_stubs:
            lib = self.stub_lib(variant)
            link = [f"-L{lib.parent}", "-lrefcnt", f"-Wl,-rpath,{lib.parent}"]
            return cc(out, sources, ["-O2", "-fno-omit-frame-pointer", *flags, *link])
        stub_obj = self.root / variant / "refcnt.o"
        if not stub_obj.exists():
            cc(stub_obj, [EXAMPLES / "refcnt.c"], [*STUB_VARIANTS[variant], "-c"])
        return cc(out, [*sources, stub_obj], ["-O2", "-fno-omit-frame-pointer", *flags])

    def usdt_objects(self, opt: str) -> tuple[Path, Path]:
        """widget.c compiled with its SDT provider (dtrace -h / -G), position independent."""
        out = self.root / f"usdt{opt}"
        header, probes = out / "widgetprobes.h", out / "widgetprobes.o"
        if not probes.exists():
            out.mkdir(parents=True, exist_ok=True)
            d = FIXTURES / "widgetprobes.d"
            subprocess.run(["dtrace", "-h", "-s", str(d), "-o", str(header)], check=True)
            subprocess.run(["dtrace", "-G", "-fPIC", "-s", str(d), "-o", str(probes)],
                           check=True, capture_output=True)
        return out, probes

    def usdt_program(self, opt: str = "-O2", shared: bool = False) -> tuple[Path, Path]:
        """(program, module holding the probes): widgetmain linked with widget.c or libwidget.so."""
        out, probes = self.usdt_objects(opt)
        flags = [opt, "-fno-omit-frame-pointer", f"-I{out}", f"-I{FIXTURES}"]
        if not shared:
            exe = out / "widgetmain"
            if not exe.exists():
                cc(exe, [FIXTURES / "widgetmain.c", FIXTURES / "widget.c", probes], flags)
            return exe, exe
        lib = out / "libwidget.so"
        if not lib.exists():
            cc(lib, [FIXTURES / "widget.c", probes], [*flags, "-fPIC", "-shared"])
        exe = out / "widgetmain-lib"
        if not exe.exists():
            cc(exe, [FIXTURES / "widgetmain.c"],
               [*flags, f"-L{out}", "-lwidget", f"-Wl,-rpath,{out}"])
        return exe, lib

    def perflike(self, variant: str = "O2fp", shared_stubs: bool = False) -> Path:
        return self.program("perflike", [EXAMPLES / "perflike.c"], variant, shared_stubs)


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is required to build the test fixtures")
    return Build(tmp_path_factory.mktemp("fixtures"))


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUserPython]:
    """This checkout's refcntd where `nobody` can run it (tests/otheruser.py), or a
    failure that says why not: never a test that passes or fails for the clone's place."""
    try:
        laid_out = OtherUserPython()
    except (OSError, RuntimeError) as err:
        pytest.fail(f"cannot lay refcntd out for another user: {err}")
    yield laid_out
    laid_out.close()


@pytest.fixture(params=["entry", "callsites"])
def probe_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with every function probe forced to one placement (the CLI reads
    REFCNTD_PROBE_MODE as its --probe-mode default): counts must not depend on it."""
    monkeypatch.setenv("REFCNTD_PROBE_MODE", request.param)
    return request.param


def assert_probe_mode(report: dict, mode: str) -> None:
    """Forced call sites really replaced the entry probes wherever they are complete."""
    probes = [p for p in report["tracing"]["probes"] if not p["function"].startswith("usdt ")]
    if mode == "entry":
        assert all(p["mode"] == "entry" for p in probes), probes
    else:
        assert any(p["mode"] == "callsites" for p in probes), probes


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None


def refcntd(args: list[str], json_path: Path | None = None, timeout: float = 120,
            env: dict | None = None) -> Result:
    """Run the real CLI in a subprocess; parse its JSON report when asked for one."""
    extra = ["--json", str(json_path)] if json_path else []
    if extra and args and args[0] in ("run", "attach"):
        args = [args[0], *extra, *args[1:]]
    proc = subprocess.run([*REFCNTD, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)
    report = json.loads(json_path.read_text()) if json_path and json_path.exists() else None
    return Result(proc.returncode, proc.stdout, proc.stderr, report)


def refcntd_peak(args: list[str], json_path: Path, timeout: float = 120) -> tuple[Result, int]:
    """`refcntd(args, json_path)` and its peak RSS in KiB, from wait4 on it: its own and
    that of the children it waited for.  RUSAGE_CHILDREN would be the largest of every
    child this test process ever waited for (an xdist worker's earlier tests' too)."""
    args = [args[0], "--json", str(json_path), *args[1:]]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*REFCNTD, *args], stdout=out, stderr=err, text=True,
                                cwd=ROOT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        out.seek(0)
        err.seek(0)
        report = json.loads(json_path.read_text()) if json_path.exists() else None
        return Result(proc.returncode, out.read(), err.read(), report), usage.ru_maxrss


LIBRARY_SPEC = """version: 1
name: {type}
library: {library}
roles:
  init:
    - functions: [{new}]
      object: return
      type: {{name: {type}}}
  get:
    - {{functions: [{ref}], object: arg1}}
  put:
    - {{functions: [{unref}], object: arg1}}
"""  # a library's new/ref/unref API, as `spec draft` proposes it and a user confirms it


def leak_summary(process: dict) -> dict[str, list[int]]:
    """type -> sorted final counts of its leaked objects."""
    out: dict[str, list[int]] = {}
    for group in process["groups"]:
        out.setdefault(group["type"], []).extend(i["count"] for i in group["instances"])
    return {k: sorted(v) for k, v in out.items()}


def hostile_history(build: Build, tmp_path: Path, name: str, *defines: str) -> dict:
    """The one process of `refcntd run --history` on fixture `name`.c built -O2
    without frame pointers (the issue-31 ownership fixtures), with `defines`
    (-D...) for a variant; it must leak.  With --no-leak-kinds: these fixtures keep
    their objects where perf does (a global dsos list, an owner), so leak kinds
    call them still reachable and the run passes; their subject is the culprit."""
    exe = build.program("-".join([name, *defines]), [FIXTURES / f"{name}.c"], "O2",
                        flags=["-fomit-frame-pointer", "-Wall", "-Werror",
                               *(f"-D{d}" for d in defines)])
    result = refcntd(["run", "--history", "--no-leak-kinds", "--", str(exe)], tmp_path / "r.json",
                     timeout=180)
    assert result.returncode == 23, result.stderr
    assert result.report is not None
    (process,) = result.report["processes"]
    return process


def marked_line(source: Path, name: str) -> int:
    """The line of fixture `source` that carries the comment `LINE:<name>`."""
    (line,) = [i for i, text in enumerate(source.read_text().splitlines(), 1)
               if f"LINE:{name} " in text]
    return line


def functions(group: dict) -> list[str]:
    return [f.get("function", "") for f in group["stack"]]


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/bpf loads real BPF: marked `bpf` (-m bpf / -m 'not bpf').
    Under pytest-xdist (scripts/test.sh), the tests of a module with a module-scoped
    fixture go to one worker (xdist_group, --dist loadgroup): its traced run or build is
    made once, not once per worker."""
    for item in items:
        if f"{os.sep}tests{os.sep}bpf{os.sep}" in str(item.fspath):
            item.add_marker(pytest.mark.bpf)
        fixturedefs = getattr(item, "_fixtureinfo", None)
        defs = fixturedefs.name2fixturedefs.values() if fixturedefs else []
        if any(d.scope == "module" for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Under pytest-xdist, a test marked `serial` runs while no other worker runs one:
    it reads the machine's global state (every loaded BPF program and map,
    uprobe_events, the next pid), which another worker's refcntd would change.  The
    other tests share a lock that a serial one takes alone; a turnstile taken by each
    before it lets no new test start while a serial one waits.  Setup and teardown
    are inside (a module fixture's traced run too)."""
    workers = getattr(item.config, "workerinput", None)
    if workers is None:  # one process: nothing runs beside the test
        yield
        return
    serial = item.get_closest_marker("serial") is not None
    where = Path(item.config._tmp_path_factory.getbasetemp()).parent  # shared by the workers
    with open(where / "turnstile.lock", "a") as turnstile, open(where / "tests.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # the lock goes with the file's close


def bad_binaries(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    true = Path("/bin/true").read_bytes()
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    elf32 = tmp_path / "elf32"
    elf32.write_bytes(true[:4] + b"\x01" + true[5:])
    trunc = tmp_path / "truncated"
    trunc.write_bytes(true[:40])
    trunc2 = tmp_path / "truncated2"
    trunc2.write_bytes(true[:300])
    return {
        "missing": (tmp_path / "nope", "no such file"),
        "directory": (tmp_path, "is a directory"),
        "script": (script, "a script"),
        "text": (text, "not an ELF file"),
        "elf32": (elf32, "32-bit ELF"),
        "truncated": (trunc, "truncated ELF"),
        "truncated-headers": (trunc2, "ELF"),
        "no-stubs": (Path("/bin/true"), "no function __refcnt__init"),
    }
