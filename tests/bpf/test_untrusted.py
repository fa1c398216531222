"""refcntd, run as root, against traced processes that attack it through the files they
name (issue 28): each attacker is a real process running as nobody.

Every run traces `sh -c '<attacker as nobody>; <victim as root>'`, both the
fixture untrusted.c (its JIT code at a fixed address, one leaked widget),
with the stubs in a shared library beside it.
Each test checks that refcntd finishes, that nothing the attacker pointed
at reached the report, and that the victim's report is whole: its leak,
its stack, its own JIT frame named from its own perf map.

Runs use --no-leak-kinds: the subject here is files an attacker plants; what the
fixtures leak is often still reachable at exit (kept in a global, or a pointer left on a
stack), which the default lists without failing.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXAMPLES, FIXTURES, cc, functions, leak_summary, refcntd, refcntd_peak
from test_run import lib_spec

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

NOBODY = "setpriv --reuid=nobody --regid=nogroup --clear-groups"
SECRET = "SECRET_only_root_may_read_this"
JIT_LINE = f"7e0000000000 40 {SECRET}\n"  # names the attacker's JIT code, if ever read
VICTIM_STACK = ["__refcnt__init", "make_widget", "victim_jit", "main"]


@dataclass
class Attack:
    program: Path  # untrusted.c, in a directory everyone can reach
    lib: Path  # the stubs, beside it
    spec: Path
    shared: Path  # sticky and world-writable, like /tmp
    secret: Path  # root-only, 0600

    def run(self, attacker: str, tmp_path: Path, probe_mode: str = "auto") -> dict:
        """`attacker` (shell, run as nobody), then the victim as root; the JSON report."""
        victim = f"{self.program} map victim_jit"
        script = f"{NOBODY} sh -c '{attacker}'; {victim}"
        result = refcntd([*RUN, "--spec", str(self.spec), "--probe-mode", probe_mode, "--",
                          "sh", "-c", script], tmp_path / "r.json", timeout=90)
        assert result.report is not None, result.stderr
        for process in result.report["processes"]:
            Path(f"/tmp/perf-{process['pid']}.map").unlink(missing_ok=True)
        assert result.returncode == 23, result.stderr
        assert SECRET not in json.dumps(result.report) + result.stdout + result.stderr
        return result.report


def untrusted(out: Path, stubs: Path, *flags: str) -> Path:
    """untrusted.c linked against the stubs library `stubs`."""
    return cc(out, [FIXTURES / "untrusted.c"], ["-O2", "-fno-omit-frame-pointer",
                                               f"-L{stubs.parent}", "-lrefcnt",
                                               f"-Wl,-rpath,{stubs.parent}", "-ldl", *flags])


@pytest.fixture()
def attack(bpf, tmp_path: Path) -> Iterator[Attack]:
    shared = Path(tempfile.mkdtemp(prefix="refcntd-attack-", dir="/tmp"))
    fd, secret = tempfile.mkstemp(prefix="refcntd-secret-")
    os.write(fd, JIT_LINE.encode())
    os.close(fd)
    try:
        lib = cc(shared / "librefcnt.so", [EXAMPLES / "refcnt.c"], ["-O2", "-fPIC", "-shared"])
        program = untrusted(shared / "untrusted", lib)
        shared.chmod(0o1777)
        yield Attack(program, lib, lib_spec(tmp_path, lib), shared, Path(secret))
    finally:
        shutil.rmtree(shared)
        os.unlink(secret)


def assert_intact(attacker: dict, victim: dict) -> None:
    for process in (attacker, victim):
        assert leak_summary(process) == {"widget": [2]}, process
    (group,) = victim["groups"]
    assert functions(group)[:4] == VICTIM_STACK, group["stack"]
    (group,) = attacker["groups"]
    assert functions(group)[:2] == VICTIM_STACK[:2], group["stack"]


def leakers(report: dict) -> tuple[dict, dict]:
    """(attacker, victim): the victim is the one run with `map victim_jit`."""
    leaking = [p for p in report["processes"] if p["groups"]]
    victim = [p for p in leaking if p["command"][1:2] == ["map"]]
    attacker = [p for p in leaking if p["command"][1:2] != ["map"]]
    assert len(victim) == len(attacker) == 1, report["processes"]
    return attacker[0], victim[0]


def test_fifo_as_perf_map_does_not_stall_the_run(attack, tmp_path):
    """Before: `run` waited forever on the FIFO (the report worker opened it)."""
    started = time.monotonic()
    report = attack.run(f"mkfifo /tmp/perf-$$.map && exec {attack.program}", tmp_path)
    assert time.monotonic() - started < 60
    assert_intact(*leakers(report))


def test_perf_map_linked_to_a_root_only_file_is_not_read(attack, tmp_path):
    """The secret names the attacker's JIT address: read as root, it would be its name."""
    report = attack.run(f"ln -s {attack.secret} /tmp/perf-$$.map && exec {attack.program}",
                        tmp_path)
    attacker, victim = leakers(report)
    assert_intact(attacker, victim)
    assert functions(attacker["groups"][0])[2] == ""  # the JIT frame: no name


def test_perf_map_of_another_user_is_not_read(attack, tmp_path):
    """A third user (daemon) plants the map of nobody's process: perf's rule (owned by the
    process's user or root) refuses its names."""
    pidfile = attack.shared / "pid"
    planter = subprocess.Popen(
        ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups", "sh", "-c",
         f"while [ ! -s {pidfile} ]; do sleep 0.05; done; "
         f"printf '{JIT_LINE}' > /tmp/perf-$(cat {pidfile}).map; touch {pidfile}.done"])
    try:
        report = attack.run(f"echo $$ > {pidfile}; while [ ! -e {pidfile}.done ]; do sleep "
                            f"0.05; done; exec {attack.program}", tmp_path)
    finally:
        planter.kill()
        planter.wait()
    attacker, victim = leakers(report)
    assert pwd.getpwuid(os.stat(pidfile).st_uid).pw_name == "nobody"
    assert_intact(attacker, victim)


def test_debuglink_naming_a_root_only_file_is_ignored(attack, tmp_path):
    """A stripped program whose .gnu_debuglink names, by absolute path and without CRC, a
    root-only ELF with the same code and build-id: read, its symbols would name the
    attacker's frames.  gdb's rule: a debug link is a file name, searched in the debug
    directories only."""
    same_id = "-Wl,--build-id=0x" + "5ec7e75ec7" * 4  # 20 bytes, as the kernel records
    secret_elf = untrusted(tmp_path / "secret.debug", attack.lib, f"-Dmake_widget={SECRET}",
                           same_id)
    secret_elf.chmod(0o600)
    stripped = untrusted(attack.shared / "stripped", attack.lib, same_id)
    blob = tmp_path / "link"
    blob.write_bytes(str(secret_elf).encode() + b"\0")  # a name, no CRC
    subprocess.run(["objcopy", "--strip-all", "--add-section", f".gnu_debuglink={blob}",
                    str(stripped)], check=True)
    # entry probes: call sites found in this stripped program read no type name (a
    # separate bug, in the call-site scan)
    attacker, victim = leakers(attack.run(f"exec {stripped}", tmp_path, "entry"))
    assert leak_summary(attacker) == {"widget": [2]}
    (group,) = attacker["groups"]
    assert functions(group)[:2] == ["__refcnt__init", ""], group["stack"]  # stripped
    assert_intact(victim, victim)


def test_fifo_where_a_library_was_does_not_stall_the_run(attack, tmp_path):
    """The attacker maps a library, replaces it by a FIFO named as /proc/PID/maps shows
    the deleted file, and forks: refcntd reads the child's maps on the capture thread.
    Before: that thread waited on the FIFO forever."""
    own = f"{attack.shared}/lib-$$"
    report = attack.run(f"mkdir {own} && cp {attack.lib} {own}/libx.so && "
                        f"exec {attack.program} fifolib {own}/libx.so", tmp_path)
    assert_intact(*leakers(report))


def test_refused_file_is_one_note_in_the_process_report(attack, tmp_path):
    report = attack.run(f"mkfifo /tmp/perf-$$.map && exec {attack.program}", tmp_path)
    attacker, victim = leakers(report)
    (note,) = attacker["notes"]
    assert note == f"perf map /tmp/perf-{attacker['pid']}.map: is a FIFO, not a regular " \
                   "file: JIT frames not named"
    assert victim["notes"] == []


def test_a_hollow_module_named_through_proc_self_is_not_read(attack, tmp_path):
    """A nobody process dlopen()s a library from a memfd it made 3 GiB big (a hole after
    a copy of libz: it costs the process nothing), as /proc/self/fd/9, then the probed
    library: it is stopped for its unwind tables and scanned for call sites, which read
    every module it maps, the memfd through /proc/PID/map_files ("/memfd:module
    (deleted)").  refcntd used to read it whole, twice (6 GiB of its memory, the process
    held 15 s), and opened /proc/self/fd/9 in its own process (another file).  Now the
    name is the process's descriptor, and the file is refused as mostly holes."""
    program = cc(attack.shared / "bigmodule", [FIXTURES / "bigmodule.c"], ["-O2", "-ldl"])
    libz = shutil.copy("/usr/lib/x86_64-linux-gnu/libz.so.1", attack.shared / "libz.so")
    attacker = f"{program} {libz} {3 << 30} 9 {attack.lib}"
    result, peak = refcntd_peak([*RUN, "--spec", str(attack.spec), "--", "sh", "-c",
                                 f"{NOBODY} {attacker}"], tmp_path / "r.json", timeout=300)
    assert "MAPPED /proc/self/fd/9" in result.stdout, result.stderr
    assert peak < 1 << 20, peak  # KiB: 1 GiB (refcntd and the processes it ran)
    (pid,) = [p["pid"] for p in result.report["processes"] if p["comm"] == "bigmodule"]
    notes = json.dumps(result.report)
    assert "/proc/self/fd" not in notes
    assert f"/proc/{pid}/fd/9: mostly holes ({3 << 30} bytes, " in notes, notes
