"""One object's operations as the attribution reads them: each an operation with a
count at one symbolized path (the functions from the refcount call outward), and
the culprit named from them.  What pairing, the verdict rules and the outputs share."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

FuncKey = tuple[str, str]  # (module file name, function or raw address)
CulpritKey = tuple[str, FuncKey, tuple[FuncKey, ...]]

START_FUNCTIONS = frozenset({"main", "_start", "__libc_start_main", "__libc_start_call_main",
                             "start_thread"})
MISSING_PUT = "missing put"
EXTRA_GET = "extra get"


@dataclass(frozen=True)
class PathOp:
    """An operation (with multiplicity) at one symbolized path."""

    op: Role
    frames: tuple[Frame, ...]  # from the refcount call outward, stub frames dropped
    count: int
    first_ns: int = 0  # when it first / last happened at this path (0: not known)
    last_ns: int = 0

    @cached_property  # pairing compares paths of every get with every put
    def path(self) -> tuple[FuncKey, ...]:
        return tuple(func_key(f) for f in self.frames)


@dataclass
class Culprit:
    kind: str  # MISSING_PUT or EXTRA_GET
    function: Frame
    frames: tuple[Frame, ...]  # the unmatched get's path, up to and including the culprit
    objects: int = 0  # leaked objects of the group where this get stays unmatched
    references: int = 0  # unmatched references in those objects
    released_uses: int = 0  # gets through the same path in objects released correctly
    leaked_objects: set[int] = field(default_factory=set, repr=False)
    expected: tuple[Frame, ...] = ()  # where released objects put such a reference
    why: str = ""  # why this function and not another
    tie: tuple[str, ...] = ()  # functions with the same evidence, this one included
    holder: str = ""  # indirect leaks: the leaked object whose culprit this is
    # a missing put: the object's last operation made under the culprit's call (the
    # culprit's frame is the call after which the reference was dropped), when timed
    last_use: tuple[Frame, ...] = ()
    # found against an earlier run of the same workload (--baseline): that run's name
    baseline: str = ""
    # a missing put: where the culprit's code skips every put released objects made in
    # it (the branch of an early return), with their lines
    exits: tuple[Frame, ...] = ()
    # which rule named it (analysis.calibration measures each one on real mutants)
    rule: str = ""

    @property
    def evidence(self) -> str:
        """What named it, in the words of the report: the run's own history, good
        runs of the same workload (--baseline), or the holders found at the scan."""
        if self.baseline or self.rule.startswith("good-runs"):
            return "good runs"
        if self.rule.startswith("holders"):
            return "holders"
        return "history"

    def key(self) -> CulpritKey:
        return (self.kind, func_key(self.function), tuple(func_key(f) for f in self.frames))


def func_key(frame: Frame) -> FuncKey:
    if frame.function:
        return (frame.module.rsplit("/", 1)[-1], frame.function)
    return (frame.module.rsplit("/", 1)[-1], frame.raw or hex(frame.vaddr))


def is_get(op: Role) -> bool:
    return op in (Role.INIT, Role.GET)


def frame_name(frame: Frame) -> str:
    """A frame as the verdicts' reasons name it: its function, or its address."""
    return frame.function or f"0x{frame.vaddr:x}"
