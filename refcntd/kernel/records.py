"""Decoded kernel records: what the kernel stage (the parts of kernel/loader.py's
Kernel, through decode.py) hands to the rest of refcntd.

Nothing after the kernel stage sees ctypes or raw bytes; these frozen
dataclasses are the boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from refcntd.kernel.abi import AnomalyKind, EventKind, Role, Truncation, UnwindMethod


@dataclass(frozen=True)
class RawFrame:
    """One frame of a build-id stack: resolvable after the process is gone."""

    build_id: str | None  # hex; None when the kernel fell back to a raw ip
    offset: int  # file offset when build_id or file is set, else a raw virtual address
    file: tuple[int, int] | None = None  # (kernel dev, inode) when no build-id was known
    text_relative: bool = False  # offset is from the executable segment's start, not the file


@dataclass(frozen=True)
class StackRef:
    """A stack as the kernel stored it (key in its stack store, 0: none) and the
    caller's return address read at the probe (0 when it is in the stack)."""

    stack_id: int
    caller_ip: int


@dataclass(frozen=True)
class StackRecord:
    """One stored stack: return addresses, the same frames as (build-id, file
    offset), and how the walk went."""

    ips: tuple[int, ...]
    frames: tuple[RawFrame, ...]
    method: UnwindMethod
    truncated: Truncation  # Truncation.NONE: the walk reached its end
    truncated_at: int  # frame index where the walk stopped


@dataclass(frozen=True)
class HistoryEvent:
    op: Role
    count_after: int
    where: StackRef
    ts: int


Totals = tuple[int, int, int, int]  # a type's (inits, gets, puts, releases)


def add_totals(into: dict[str, Totals], name: str, sums: Iterable[int]) -> None:
    """into[name] += sums, field by field."""
    old = into.get(name, (0, 0, 0, 0))
    a, b, c, d = (x + y for x, y in zip(old, sums, strict=True))
    into[name] = (a, b, c, d)


@dataclass(frozen=True)
class SiteCount:
    """How often one object (or, for ReleasedSite, released objects) had `op` at `where`."""

    op: Role
    where: StackRef
    count: int
    first_ns: int = 0  # when it first / last happened (0 for ReleasedSite)
    last_ns: int = 0


@dataclass(frozen=True)
class HistoryRecord:
    total_ops: int  # the first len(events) are kept, the rest dropped
    events: tuple[HistoryEvent, ...]
    sites: tuple[SiteCount, ...]
    site_overflow: int  # operations whose path could not be counted (path map full)


@dataclass(frozen=True)
class ReleasedSite:
    """What released objects of one type did at one path (history's baseline)."""

    type_name: str  # "" when the kernel could not read it: see name_ptr
    name_ptr: int  # the name's address, which tells apart the types the kernel left unnamed
    site: SiteCount


@dataclass(frozen=True)
class SiteLive:
    """Live objects of one process created at one allocation site (SITES): what a
    scrape or a diff reads instead of every object."""

    tgid: int
    gen: int
    type_name: str  # "" when the kernel could not read it: see name_ptr
    name_ptr: int
    stack: StackRef
    live: int
    created: int  # ever, at this site
    since: int  # created since the kernel's checkpoint, still live
    since_mean_ns: int  # their mean creation time (CLOCK_MONOTONIC), 0 when none
    ops: Totals = (0, 0, 0, 0)  # type_id 0 only: (inits, gets, puts, releases) here


@dataclass(frozen=True)
class AgeBin:
    """Live objects of one process and type created in [start_ns, end_ns)."""

    tgid: int
    type_name: str
    name_ptr: int
    start_ns: int
    end_ns: int
    count: int


@dataclass(frozen=True)
class ObjectRecord:
    tgid: int
    gen: int
    addr: int
    count: int
    type_name: str
    init_ns: int
    stack_id: int
    caller_ip: int
    name_ptr: int
    gets: int
    puts: int
    history: HistoryRecord | None = None


@dataclass(frozen=True)
class LifecycleEvent:
    kind: EventKind
    tgid: int
    pid: int
    gen: int
    ts: int
    exit_code: int
    comm: str
    path: str
    argv: tuple[str, ...] = field(default_factory=tuple)



@dataclass(frozen=True)
class AnomalyRecord:
    anomaly: AnomalyKind
    tgid: int
    tid: int
    gen: int
    ts: int
    addr: int
    count_before: int
    type_name: str
    name_ptr: int
    where: StackRef  # the offending operation
    alloc: StackRef | None  # None: the object was never seen initialised
    init_ns: int
    released_ns: int


@dataclass(frozen=True)
class ProbeFailure:
    """A planned probe the kernel refused: which site (its index in the plan), at
    which step, and the kernel's errno, so no one has to parse a message."""

    site_index: int
    stage: str  # STAGE_OPEN, STAGE_LINK or STAGE_MULTI
    errno: int
    message: str


STAGE_OPEN = "perf_event_open"  # the uprobe itself was refused
STAGE_LINK = "bpf link"  # the uprobe exists but the BPF program could not be linked to it
STAGE_MULTI = "uprobe_multi link"  # a one-site multi link: the kernel refused the uprobe
