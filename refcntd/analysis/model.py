"""The report's data model: what a run found, independent of any output format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from refcntd.analysis.judging import Verdict
from refcntd.analysis.pathops import Culprit, PathOp
from refcntd.kernel.abi import Stat
from refcntd.symbolize.symbolizer import Frame

FrameKeys = tuple[tuple[str, str, int], ...]  # Frame.key() of each frame of a stack
LeakKey = tuple[str, FrameKeys]  # (type name, allocation stack)
AnomalyKey = tuple[str, str, FrameKeys]  # (kind, type name, stack)

STATE_EXITED = "exited"
STATE_LIVE_AT_DETACH = "live at detach"
STATE_EXIT_NOT_SEEN = "exit not seen"


@dataclass(frozen=True)
class StackUnwind:
    """How a stack was obtained: the walk's method and where and why it stopped early."""

    method: str = ""  # "frame pointers", "CFI", "frame pointers and CFI"; "" when unknown
    truncated_at: int | None = None  # frame index where the walk stopped, None: complete
    reason: str = ""  # why it stopped there

    def describe(self) -> str:
        if self.truncated_at is None:
            return self.method
        return f"truncated at frame {self.truncated_at}: {self.reason}"


@dataclass(frozen=True)
class HistoryStep:
    op: str  # init, get, put, delete
    count_after: int
    frames: tuple[Frame, ...]
    at_ns: int  # since the object's init
    unwind: StackUnwind = field(default_factory=StackUnwind)


@dataclass(frozen=True)
class Holder:
    """A leaked object that holds references of another (--history)."""

    address: int
    type_name: str
    references: int
    frames: tuple[Frame, ...]  # where the held reference was got


@dataclass(frozen=True)
class Pointer:
    """A slot pointing to a leaked object at the scan (reach/holders.py says which count)."""

    holder: str  # `map 0x55d0..+0x18`, `global dsos+0x8 (perf)`, `a 64-byte block 0x..+0x10`
    slot: int  # the slot's address (0: a register)
    interior: bool  # points inside the object, not at its start
    counted: bool = True  # holds a reference
    why: str = ""  # not counted: why (a link of its own; a cleared node)


@dataclass(frozen=True)
class LeakedObject:
    address: int
    count: int
    gets: int
    puts: int
    age_ns: int
    history: tuple[HistoryStep, ...] = ()
    history_total: int = 0  # operations seen; those beyond len(history) were dropped
    leak: str = ""  # with --history: "direct", "indirect" or "cycle"
    held_by: tuple[Holder, ...] = ()  # leaked objects holding its outstanding references
    cycle: tuple[int, ...] = ()  # the objects of its cycle (leak == "cycle")
    kind: str = ""  # --leak-kinds: "definitely lost", "indirectly lost", "still reachable",
    #                 "created after the scan"
    root: str = ""  # still reachable: what it is reachable from ("global cache (prog)")
    holders: int = -1  # slots holding a reference at the scan; -1: not scanned
    pointers: tuple[Pointer, ...] = ()  # the first of them (MAX_POINTERS), counted first

    @property
    def unheld(self) -> int:
        """References no slot holds: a get whose put was lost (docs/leak-kinds.md)."""
        return max(0, self.count - self.holders) if self.holders >= 0 else 0


@dataclass
class LeakGroup:
    """Leaked objects sharing a type and an allocation stack."""

    type_name: str
    frames: tuple[Frame, ...]
    objects: list[LeakedObject] = field(default_factory=list)
    stack_truncated: bool = False
    culprits: list[Culprit] = field(default_factory=list)
    unwind: StackUnwind = field(default_factory=StackUnwind)
    verdict: Verdict | None = None  # with --history: culprit, tie, unknown, indirect, cycle
    kind: str = ""  # --leak-kinds: the kind of all its objects; "" when not scanned
    class_name: str = ""  # the class of all its objects, read at the scan (spec `class:`);
    #                       "" when not read: the type name is all there is

    @property
    def shown_type(self) -> str:
        """`GObject (JsonParser)`: the spec's type and, when read, the class."""
        return f"{self.type_name} ({self.class_name})" if self.class_name else self.type_name

    def key(self) -> LeakKey:
        return (self.type_name, tuple(f.key() for f in self.frames))

    def references(self) -> int:
        """The references its objects still hold (objects drained or saved as columns
        sum them without building an object each)."""
        sums = getattr(self.objects, "sums", None)
        return int(sums()[0]) if sums is not None else sum(o.count for o in self.objects)

    def order(self) -> tuple[int, LeakKey]:
        """The report's order of groups: most objects first, then type name, then the
        allocation stack's (module, function, offset) frames: the same from run to run."""
        return (-len(self.objects), self.key())


ANOMALY_TEXT = {
    "double-put": "put on an object whose count was already 0",
    "negative-count": "put on an object whose count was already below 0",
    # "released": by its last put, or by a delete where the spec has one (these two kinds
    # also fire in specs without a delete role, where "deleted" would be wrong)
    "put-after-delete": "put on an object already released (by its last put or a delete)",
    "get-after-delete": "get on an object already released (by its last put or a delete): "
                        "use after put",
    "delete-live": "delete while the count was not 0",
    "double-delete": "delete of an object already deleted",
    "unknown-get": "get on an object never seen initialised (it may predate tracing)",
    "unknown-put": "put on an object never seen initialised (it may predate tracing)",
    "unknown-delete": "delete of an object never seen initialised (it may predate tracing)",
}


@dataclass
class AnomalyFinding:
    """One kind of misuse at one stack (repeats folded into `occurrences`)."""

    kind: str
    type_name: str
    address: int  # of the first occurrence
    count_before: int
    frames: tuple[Frame, ...]
    alloc_frames: tuple[Frame, ...]  # empty when the object was never seen initialised
    occurrences: int = 0
    unwind: StackUnwind = field(default_factory=StackUnwind)  # of `frames`
    alloc_unwind: StackUnwind = field(default_factory=StackUnwind)

    @property
    def separate(self) -> bool:
        """Operations on never-seen objects are listed apart and do not fail a run."""
        return self.kind.startswith("unknown-")

    @property
    def description(self) -> str:
        return ANOMALY_TEXT[self.kind]

    def key(self) -> AnomalyKey:
        return (self.kind, self.type_name, tuple(f.key() for f in self.frames))


@dataclass
class SiteGroup:
    """Live objects of one process sharing a type and an allocation stack, counted in
    the kernel per site (no object list): what a diff or the live view shows."""

    type_name: str
    frames: tuple[Frame, ...]
    unwind: StackUnwind
    stack_truncated: bool
    live: int  # live now
    created: int  # ever created here
    since: int = 0  # created since the checkpoint and live
    since_mean_age_ns: int = 0

    def key(self) -> LeakKey:
        return (self.type_name, tuple(f.key() for f in self.frames))


@dataclass
class ProcessSites:
    """One process's allocation sites with live objects."""

    pid: int
    comm: str
    command: list[str]
    groups: list[SiteGroup] = field(default_factory=list)


@dataclass
class ProcessReport:
    pid: int
    comm: str
    command: list[str]
    state: str
    exit_status: str = ""  # "exit 0", "killed by SIGSEGV", "" when unknown
    exit_code: int | None = None  # shell-style: 128+signal when killed
    groups: list[LeakGroup] = field(default_factory=list)
    anomalies: list[AnomalyFinding] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)  # spec's kept_by_library: reason -> objects
    kernel_stats: dict[Stat, int] | None = None  # this process's own kernel counters
    notes: list[str] = field(default_factory=list)  # files refused for it (its perf map ...)
    # --history: every type's operations per path (leaked and released objects), what a
    # later run's culprits are found against (--baseline, analysis.regression)
    operations: dict[str, list[PathOp]] = field(default_factory=dict)
    direct_exit: bool = False  # ended in libc's _exit without exit(): no atexit handler ran

    @property
    def status_text(self) -> str:
        """The exit status as the report's header says it."""
        how = " through _exit without exit()" if self.direct_exit else ""
        return f"{self.exit_status}{how}" if self.exit_status else how.lstrip()

    @property
    def leaked_objects(self) -> int:
        return sum(len(g.objects) for g in self.groups)

    @property
    def misuse(self) -> list[AnomalyFinding]:
        """Anomalies that are findings (not operations on never-seen objects)."""
        return [a for a in self.anomalies if not a.separate]

    @property
    def leaked_types(self) -> int:
        return len({g.type_name for g in self.groups})

    @property
    def cycles(self) -> list[tuple[int, ...]]:
        """Leaked objects that hold each other, each cycle once."""
        return sorted({o.cycle for g in self.groups for o in owned_objects(g) if o.cycle})


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
    mode: str = "entry"  # or "callsites": one status for all of a function's call sites
    sites: int = 1
    hits: int = -1  # times it fired; -1: not known


@dataclass
class TracingStatus:
    """What makes a result trustworthy: every probe installed, nothing dropped."""

    probes: list[ProbeStatus] = field(default_factory=list)
    lost: dict[str, int] = field(default_factory=dict)  # reason -> count, zero entries omitted
    notes: list[str] = field(default_factory=list)
    stacks_cut: int = 0  # stacks the unwinder ended early (the notes say where and why)

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
    # LeakSanitizer's policy applies (run --leak-kinds, every process scanned at exit):
    # saved, so that `refcntd report` judges the run as `run` did
    leak_kinds: bool = False

    @property
    def leaked_objects(self) -> int:
        return sum(p.leaked_objects for p in self.processes if p.state != STATE_LIVE_AT_DETACH)

    @property
    def anomalies(self) -> int:
        return sum(a.occurrences for p in self.processes for a in p.misuse)


def owned_objects(group: LeakGroup) -> Sequence[LeakedObject]:
    """The objects that may carry ownership (held_by, cycle: from --history); none of a
    group drained as columns without history, which can hold a million objects."""
    return () if getattr(group.objects, "without_ownership", False) else group.objects
