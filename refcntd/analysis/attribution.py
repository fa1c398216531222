"""Which get has no put: name the likely culprit of each leak group.

Each operation is known by its *path*: the functions from the refcount
call outward (the stub itself dropped).  Within one leaked object every put
is matched with the get whose path shares the deepest common caller with
the put's path; ties go to the object's initial reference, then to gets
made through a reference source, so that in

    funcA() { get(obj); return obj; }      funcC() { o = funcA(); get(o); put(o); }

funcC's put balances the reference funcA handed it and funcC's own get is
the extra one.  A *reference source* is a function whose gets outnumber its
puts in objects that were released correctly (a getter or constructor that
hands references to its callers).  The culprit of an unmatched get is the
first function on its path, outward, that is not a reference source: it got
(or received) the reference and kept it.  A put belongs to the first
function on its path that is not a *reference sink* (a put wrapper such as
`release()`, whose puts outnumber its gets in released objects).  The
culprit is a *missing put* when no put of the object belongs to it, an
*extra get* when one does: it puts the object, but got it once more.
When no object of the type was released, matched pairs inside the leaked
objects serve as the evidence instead: every function on a matched get's
path below the function where it met its put handed that reference up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

FuncKey = tuple[str, str]  # (module file name, function or raw address)

MISSING_PUT = "missing put"
EXTRA_GET = "extra get"


@dataclass(frozen=True)
class PathOp:
    """An operation (with multiplicity) at one symbolized path."""

    op: Role
    frames: tuple[Frame, ...]  # from the refcount call outward, stub frames dropped
    count: int

    @property
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

    def key(self) -> tuple[str, tuple[FuncKey, ...]]:
        return (self.kind, tuple(func_key(f) for f in self.frames))


def func_key(frame: Frame) -> FuncKey:
    if frame.function:
        return (frame.module.rsplit("/", 1)[-1], frame.function)
    return (frame.module.rsplit("/", 1)[-1], frame.raw or hex(frame.vaddr))


def is_get(op: Role) -> bool:
    return op in (Role.INIT, Role.GET)


def _balances(released: Iterable[PathOp]) -> dict[FuncKey, int]:
    """Per function: references got through it minus references put through it."""
    balance: dict[FuncKey, int] = {}
    for op in released:
        sign = 1 if is_get(op.op) else -1 if op.op == Role.PUT else 0
        for func in set(op.path):
            balance[func] = balance.get(func, 0) + sign * op.count
    return balance


def reference_sources(released: Iterable[PathOp]) -> set[FuncKey]:
    """Functions through which released objects got more references than they put."""
    return {func for func, value in _balances(released).items() if value > 0}


def reference_sinks(released: Iterable[PathOp]) -> set[FuncKey]:
    """Functions through which released objects put more references than they got."""
    return {func for func, value in _balances(released).items() if value < 0}


def put_owner(put: PathOp, sinks: set[FuncKey]) -> FuncKey | None:
    return next((func for func in put.path if func not in sinks), None)


def common_depth(a: tuple[FuncKey, ...], b: tuple[FuncKey, ...]) -> int:
    """Length of the common outer part (main side) of two paths."""
    depth = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        depth += 1
    return depth


def pair_puts(ops: list[PathOp], sources: set[FuncKey]
              ) -> tuple[list[tuple[PathOp, int]], set[FuncKey]]:
    """Pair every put of one object with a get.

    Returns the gets left over, and the functions that handed a matched
    reference up to where it was put (sources, by this object's evidence).
    """
    gets: list[list[Any]] = [[op, op.count] for op in ops if is_get(op.op)]  # [get, refs left]
    puts = sorted((op for op in ops if op.op == Role.PUT), key=lambda o: -len(o.frames))
    handed_up: set[FuncKey] = set()
    for put in puts:
        for _ in range(put.count):
            open_gets = [g for g in gets if g[1] > 0]
            if not open_gets:
                break
            best = max(open_gets, key=lambda g: _match_rank(g[0], put, sources))
            best[1] -= 1
            path = best[0].path
            handed_up.update(path[:len(path) - common_depth(path, put.path)])
    return [(op, left) for op, left in gets if left > 0], handed_up


def unmatched_gets(ops: list[PathOp], sources: set[FuncKey]) -> list[tuple[PathOp, int]]:
    """The gets of one object left over after pairing every put with a get."""
    return pair_puts(ops, sources)[0]


def _match_rank(get: PathOp, put: PathOp, sources: set[FuncKey]) -> tuple[int, bool, bool, int]:
    via_source = bool(get.path) and get.path[0] in sources
    return (common_depth(get.path, put.path), get.op == Role.INIT, via_source, len(get.frames))


def culprit_of(get: PathOp, ops: list[PathOp], sources: set[FuncKey], sinks: set[FuncKey]
               ) -> Culprit | None:
    """The first non-source function on the get's path, and whether it owns a put."""
    for i, func in enumerate(get.path):
        if func in sources:
            continue
        puts_here = any(op.op == Role.PUT and put_owner(op, sinks) == func for op in ops)
        return Culprit(EXTRA_GET if puts_here else MISSING_PUT, get.frames[i],
                       get.frames[:i + 1])
    return None


def attribute(objects: list[tuple[int, list[PathOp]]], released: list[PathOp]) -> list[Culprit]:
    """Culprits of a leak group: `objects` are (address, operations) of its leaked objects."""
    sources, sinks = reference_sources(released), reference_sinks(released)
    paired = [(address, ops, *pair_puts(ops, sources)) for address, ops in objects]
    for _, _, _, handed_up in paired:
        sources |= handed_up
    found: dict[tuple[str, tuple[FuncKey, ...]], Culprit] = {}
    for address, ops, unmatched, _ in paired:
        for get, left in unmatched:
            culprit = culprit_of(get, ops, sources, sinks)
            if culprit is None:
                continue
            culprit = found.setdefault(culprit.key(), culprit)
            culprit.leaked_objects.add(address)
            culprit.references += left
    for culprit in found.values():
        culprit.objects = len(culprit.leaked_objects)
        culprit.released_uses = _released_uses(culprit, released)
    return sorted(found.values(), key=lambda c: (-c.objects, -c.references, c.released_uses))


def _released_uses(culprit: Culprit, released: list[PathOp]) -> int:
    prefix = tuple(func_key(f) for f in culprit.frames)
    return sum(op.count for op in released
               if is_get(op.op) and op.path[:len(prefix)] == prefix)
