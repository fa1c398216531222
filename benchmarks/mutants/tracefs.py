"""Plain ftrace uprobe events: the benchmark's independent instrument.

No BPF and nothing of refcntd: events are defined in
/sys/kernel/tracing/uprobe_events under a group of this process's own, and
recorded in a private tracefs instance that follows only the workload's
processes (set_event_pid + event-fork), with a global clock and the tgid of
each event.  A uprobe's hit count (uprobe_profile) counts every process.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

TRACEFS = Path("/sys/kernel/tracing")
# "perf-1234    (   1234) [001] ..... 12.345678: get: (0x55..) obj=0x.. name=\"dso\""
LINE = re.compile(r"-(?P<tid>\d+) +\( *(?P<tgid>\d+|-+)\) +\[\d+\][^:]*: (?P<event>\w+): "
                  r"\([^)]*\)(?P<args>.*)$")
ARG = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass(frozen=True)
class Probe:
    """One uprobe (or uretprobe) event: NAME at PATH + file offset, with fetch args."""

    name: str
    path: str
    offset: int
    fetch: str = ""  # e.g. "obj=%si:x64 name=+0(%dx):string"
    ret: bool = False

    def definition(self, group: str) -> str:
        kind = "r" if self.ret else "p"
        return f"{kind}:{group}/{self.name} {self.path}:{self.offset:#x} {self.fetch}".rstrip()


@dataclass(frozen=True)
class Event:
    tgid: int
    name: str
    args: dict[str, str]


@dataclass
class Traced:
    """What a traced run left: events in kernel order, hits per probe, losses."""

    events: list[Event] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    returncode: int = 0
    stderr: str = ""


@contextmanager
def _probes(group: str, probes: Sequence[Probe]) -> Iterator[None]:
    """Define the events, and remove them after.  uprobe_events takes appends
    (O_APPEND): opening it for writing without it would clear every event."""
    fd = os.open(TRACEFS / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    done: list[Probe] = []
    try:
        for p in probes:
            os.write(fd, f"{p.definition(group)}\n".encode())
            done.append(p)
        yield
    finally:
        for p in done:
            os.write(fd, f"-:{group}/{p.name}\n".encode())
        os.close(fd)


def _hits(probes: Sequence[Probe]) -> dict[str, int]:
    """uprobe_profile lines are "path event hits", without the group."""
    mine = {(p.path, p.name) for p in probes}
    out: dict[str, int] = {}
    for line in (TRACEFS / "uprobe_profile").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and (parts[0], parts[1]) in mine:
            out[parts[1]] = out.get(parts[1], 0) + int(parts[2])
    return out


def _lost(instance: Path) -> int:
    lost = 0
    for stats in (instance / "per_cpu").glob("cpu*/stats"):
        for line in stats.read_text().splitlines():
            if line.startswith(("overrun:", "dropped events:")):
                lost += int(line.split(":")[1])
    return lost


def parse(text: str) -> list[Event]:
    out: list[Event] = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m is None:
            continue
        tgid = int(m.group("tgid")) if m.group("tgid").isdigit() else int(m.group("tid"))
        args = {k: v.strip('"') for k, v in ARG.findall(m.group("args"))}
        out.append(Event(tgid, m.group("event"), args))
    return out


def run(cmd: Sequence[str], probes: Sequence[Probe], *, record: bool = True,
        env: dict[str, str] | None = None, cwd: Path | None = None, buffer_kb: int = 65536,
        timeout: float = 900) -> Traced:
    """Run CMD with the probes defined; record its (and its descendants') events."""
    group = f"rmut{os.getpid()}"
    instance = TRACEFS / "instances" / group
    with _probes(group, probes):
        instance.mkdir()
        try:
            return _traced_run(cmd, instance, group, probes, record, env, cwd, buffer_kb,
                               timeout)
        finally:
            (instance / "events" / group / "enable").write_text("0")
            instance.rmdir()


def _traced_run(cmd: Sequence[str], instance: Path, group: str, probes: Sequence[Probe],
                record: bool, env: dict[str, str] | None, cwd: Path | None, buffer_kb: int,
                timeout: float) -> Traced:
    (instance / "buffer_size_kb").write_text(str(buffer_kb if record else 64))
    (instance / "trace_clock").write_text("global")
    (instance / "options" / "record-tgid").write_text("1")
    (instance / "options" / "event-fork").write_text("1")
    read_fd, write_fd = os.pipe()
    # A shell waits on the pipe until its pid is in set_event_pid, then execs CMD.
    gate = ["/bin/sh", "-c", f'read -r _ <&{read_fd}; exec "$@"', "sh", *cmd]
    proc = subprocess.Popen(gate, env=env, cwd=cwd, pass_fds=(read_fd,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(read_fd)
    (instance / "set_event_pid").write_text(str(proc.pid))
    (instance / "events" / group / "enable").write_text("1")
    os.write(write_fd, b"go\n")
    os.close(write_fd)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    (instance / "events" / group / "enable").write_text("0")
    out = Traced(returncode=proc.returncode, hits=_hits(probes), lost=_lost(instance),
                 stderr=err.decode(errors="replace")[-4000:])
    if record:
        out.events = parse((instance / "trace").read_text())
    return out
