"""The report's data model: what a run found, independent of any output format."""

from __future__ import annotations

from dataclasses import dataclass, field

from refcntd.symbolize import Frame

STATE_EXITED = "exited"
STATE_LIVE_AT_DETACH = "live at detach"
STATE_EXIT_NOT_SEEN = "exit not seen"


@dataclass(frozen=True)
class LeakedObject:
    address: int
    count: int
    gets: int
    puts: int
    age_ns: int


@dataclass
class LeakGroup:
    """Leaked objects sharing a type and an allocation stack."""

    type_name: str
    frames: tuple[Frame, ...]
    objects: list[LeakedObject] = field(default_factory=list)
    stack_truncated: bool = False

    def key(self) -> tuple:
        return (self.type_name, tuple(f.key() for f in self.frames))


@dataclass
class ProcessReport:
    pid: int
    comm: str
    command: list[str]
    state: str
    exit_status: str = ""  # "exit 0", "killed by SIGSEGV", "" when unknown
    exit_code: int | None = None  # shell-style: 128+signal when killed
    groups: list[LeakGroup] = field(default_factory=list)

    @property
    def leaked_objects(self) -> int:
        return sum(len(g.objects) for g in self.groups)

    @property
    def leaked_types(self) -> int:
        return len({g.type_name for g in self.groups})


@dataclass
class ProbeStatus:
    role: str
    function: str
    module: str
    probe_offset: int
    cost: str
    reason: str
    installed: bool
    error: str = ""


@dataclass
class TracingStatus:
    """What makes a result trustworthy: every probe installed, nothing dropped."""

    probes: list[ProbeStatus] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)  # reason -> count, zero entries omitted
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(p.installed for p in self.probes) and not self.lost


@dataclass
class RunResult:
    mode: str  # "run" | "attach"
    spec: str
    target: str
    processes: list[ProcessReport] = field(default_factory=list)
    tracing: TracingStatus = field(default_factory=TracingStatus)
    command_status: int | None = None  # run: the command's own exit status

    @property
    def leaked_objects(self) -> int:
        return sum(p.leaked_objects for p in self.processes if p.state != STATE_LIVE_AT_DETACH)
