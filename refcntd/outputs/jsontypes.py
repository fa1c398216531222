"""The `--json` report document (schema "refcntd-report", version 1) as types.

report.py writes these and runjson.py reads them back; naming each record
here lets mypy check that writer and reader agree on the keys.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class FrameJson(TypedDict):
    module: str
    address: str  # "0x..."
    function: NotRequired[str]
    offset: NotRequired[int]
    file: NotRequired[str]
    line: NotRequired[int]
    unresolved: NotRequired[str]  # the raw address text of an unknown module
    inlined: NotRequired[bool]  # a function inlined at the frame below (same address)


class CulpritJson(TypedDict):
    kind: str
    function: str
    stack: list[FrameJson]
    objects: int
    references: int
    released_uses: int
    expected_stack: NotRequired[list[FrameJson]]  # where released objects put such a reference
    file: NotRequired[str]  # the line in the culprit's function of the call the reference
    line: NotRequired[int]  # came through (with DWARF only)
    put_file: NotRequired[str]  # missing put: where released objects put such a reference
    put_line: NotRequired[int]  # in the culprit's function (when they did there)
    last_use_file: NotRequired[str]  # missing put: the culprit's last call that touched
    last_use_line: NotRequired[int]  # the object on this path (the put is missing after
    last_use_call: NotRequired[str]  # it), and the function it called there
    last_use_stack: NotRequired[list[FrameJson]]  # that operation's path up to the culprit
    exit_file: NotRequired[str]  # missing put: where the culprit's code skips every put
    exit_line: NotRequired[int]  # released objects made in it (an early return's branch)
    exits: NotRequired[list[FrameJson]]  # every such place, one frame per line
    why: NotRequired[str]  # why this function and not another
    rule: NotRequired[str]  # which rule named it (analysis.calibration)
    evidence: NotRequired[str]  # history, good runs or holders
    tie: NotRequired[list[str]]  # functions with the same evidence (this one included)
    holder: NotRequired[str]  # indirect leaks: "type 0xADDR" of the leaked holder
    baseline: NotRequired[str]  # found against this earlier run (--baseline); `stack` is
    # then the path of the call that changed, up to the culprit


class HolderJson(TypedDict):
    address: str
    type: str
    references: int
    stack: list[FrameJson]


class VerdictJson(TypedDict):
    status: str  # culprit, tie, unknown, indirect, cycle
    reason: str
    notes: list[str]
    candidates: NotRequired[list[str]]  # unknown: functions a rule not trusted named


class HistoryStepJson(TypedDict):
    op: str
    count_after: int
    at_ns: int
    stack: list[FrameJson]
    unwind: NotRequired[UnwindJson]


class InstanceJson(TypedDict):
    address: str
    count: int
    gets: int
    puts: int
    age_ns: int
    leak: NotRequired[str]  # --history: direct, indirect or cycle
    held_by: NotRequired[list[HolderJson]]
    cycle: NotRequired[list[str]]
    history_total: NotRequired[int]
    history_dropped: NotRequired[int]
    history: NotRequired[list[HistoryStepJson]]
    kind: NotRequired[str]  # --leak-kinds: definitely/indirectly lost, still reachable, late
    root: NotRequired[str]  # still reachable: from what ("global cache (prog)")
    holders: NotRequired[int]  # slots holding a reference at the scan (leak kinds)
    unheld: NotRequired[int]  # references no slot holds: count - holders, at least 0
    pointers: NotRequired[list[PointerJson]]  # the first slots pointing to it


class PointerJson(TypedDict):
    """A slot pointing to a leaked object at the scan (reach/holders.py)."""

    holder: str
    slot: str  # its address ("0x0": a register)
    interior: bool
    counted: bool
    why: NotRequired[str]  # not counted: why


class UnwindJson(TypedDict):
    """How a stack was obtained (frame pointers, CFI, mixed) and where it was cut."""

    method: str
    truncated_at: NotRequired[int]
    reason: NotRequired[str]


class GroupJson(TypedDict):
    type: str
    objects: int
    stack_truncated: bool
    stack: list[FrameJson]
    culprits: list[CulpritJson]
    unwind: NotRequired[UnwindJson]
    instances: NotRequired[list[InstanceJson]]  # absent only inside stream_json
    verdict: NotRequired[VerdictJson]  # --history only
    kind: NotRequired[str]  # --leak-kinds: its objects' kind
    # its objects' class, read at the scan (spec `class:`: a GObject's GType name)
    class_name: NotRequired[str]


class AnomalyJson(TypedDict):
    kind: str
    description: str
    type: str
    address: str
    count_before: int
    occurrences: int
    separate: bool
    stack: list[FrameJson]
    alloc_stack: list[FrameJson]
    unwind: NotRequired[UnwindJson]
    alloc_unwind: NotRequired[UnwindJson]


class OperationJson(TypedDict):
    """Operations of one type at one path (--history), leaked and released objects alike."""

    type: str
    op: str  # init, get or put
    count: int
    stack: list[FrameJson]  # from the refcount call outward, its innermost frames only


class ProcessJson(TypedDict):
    pid: int
    comm: str
    command: list[str]
    state: str
    exit_status: str | None
    exit_code: int | None
    direct_exit: NotRequired[bool]  # ended in libc's _exit without exit() (--leak-kinds)
    leaked_objects: int
    leaked_types: int
    anomalies: list[AnomalyJson]
    groups: list[GroupJson]
    kept_by_library: NotRequired[dict[str, int]]  # spec rules: reason -> objects set aside
    cycles: NotRequired[list[list[str]]]  # --history: leaked objects holding each other
    notes: NotRequired[list[str]]  # a line per file refused for this process (its perf map)
    operations: NotRequired[list[OperationJson]]  # --history: what --baseline compares


class ProbeJson(TypedDict):
    """The fields of analysis.model.ProbeStatus."""

    role: str
    function: str
    module: str
    probe_offset: int
    cost: str
    reason: str
    installed: bool
    error: str


class TracingJson(TypedDict):
    complete: bool
    lost: dict[str, int]
    notes: list[str]
    probes: list[ProbeJson]
    stacks_cut: NotRequired[int]


class RunJson(TypedDict):
    schema: str
    version: int
    refcntd: str
    mode: str
    spec: str
    target: str
    command_status: int | None
    leak_kinds: NotRequired[bool]
    tracing: TracingJson
    leaked_objects: int
    anomalies: int
    processes: list[ProcessJson]
