"""A leak group judged: its objects' puts paired (PairedGroup), every get left
without a put given a verdict (attribution.verdict), and the group's answer: one
culprit, a tie, or unknown with the reasons, counted (Verdict)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from refcntd.analysis.attribution import (
    FOUND,
    TIE,
    UNKNOWN,
    Baseline,
    leaks_only,
    short_frames,
    verdict,
)
from refcntd.analysis.pairing import Pairs, handed_up, kept_by_leaked
from refcntd.analysis.pathops import (
    MISSING_PUT,
    Culprit,
    CulpritKey,
    FuncKey,
    PathOp,
    frame_name,
    func_key,
    is_get,
)
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


# ---- a leak group ---------------------------------------------------------------
@dataclass
class PairedGroup:
    """A leak group's objects with their puts paired, and its baseline."""

    base: Baseline
    objects: list[tuple[int, list[PathOp], list[tuple[PathOp, int]]]]  # addr, ops, unmatched
    # per object with a leftover: the gets that could as well be it (equal_leftovers)
    alternatives: dict[int, list[PathOp]] = field(default_factory=dict)

    @classmethod
    def of(cls, objects: list[tuple[int, list[PathOp]]], released: list[PathOp],
           type_name: str = "") -> PairedGroup:
        base = Baseline.of(released)
        base.type_name = type_name
        paired: list[tuple[int, list[PathOp], list[tuple[PathOp, int]]]] = []
        alternatives: dict[int, list[PathOp]] = {}
        seen: dict[object, list[int]] = {}
        # the leaked objects' own pairs are evidence too, but they hold the bug: a
        # function whose references were left over more often than handed up keeps them
        handed: Counter[FuncKey] = Counter()
        kept: Counter[FuncKey] = Counter()
        gets_put = any(op.op == Role.GET for op in released)
        for addr, ops in objects:
            pairs = Pairs(ops, base.sources, base.wrappers)
            unmatched, matches = pairs.pair()
            paired.append((addr, ops, unmatched))
            handed.update(handed_up(matches, pairs.everywhere))
            gets_put = gets_put or any(g.op == Role.GET for g, _, _ in matches)
            kept.update(kept_by_leaked(unmatched))
            if not unmatched:
                continue
            # objects with the same history (perf's thousands of maps) are judged once
            shape = tuple((op.op, op.path, op.count) for op in ops)
            if shape not in seen:
                seen[shape] = [ops.index(a) for a in pairs.equal_leftovers()]
            alternatives[addr] = [ops[k] for k in seen[shape]]
        own = {func for func, n in handed.items() if n >= kept[func]}
        base.by_leaks = own - base.sources
        base.gets_put = gets_put
        base.sources |= own
        return cls(base, paired, alternatives)


@dataclass(frozen=True)
class Choice:
    """An object's reference left without a put that any of several gets could be
    (references are exchangeable), each leading to another function: undecided by
    the counts; the holders found at the scan may decide it (holderevidence.py)."""

    address: int
    references: int
    options: tuple[tuple[PathOp, list[Culprit] | str], ...]  # a get and what it names


@dataclass
class Verdict:
    """A group's answer: FOUND, TIE or UNKNOWN (or, set by the ownership pass,
    indirect / cycle), why, and the culprits ranked."""

    status: str
    reason: str = ""
    culprits: list[Culprit] = field(default_factory=list)
    notes: tuple[str, ...] = ()  # what was left out, with counts
    # unknown: the functions a rule named that calibration does not trust (calibration.py)
    candidates: tuple[str, ...] = ()
    choices: tuple[Choice, ...] = field(default=(), repr=False, compare=False)
    unattributed: int = 0  # unknown: the references no culprit was named for


def judge(group: PairedGroup, free: dict[int, list[tuple[PathOp, int]]]) -> Verdict:
    """Culprits of the unmatched gets in `free` (per object: those no leaked object holds)."""
    found: dict[CulpritKey, Culprit] = {}
    unknown: dict[str, int] = {}
    choices: list[Choice] = []
    for addr, ops, _ in group.objects:
        for get, left in free.get(addr, []):
            result = verdict(get, ops, group.base)
            if not isinstance(result, str):
                options: list[tuple[PathOp, list[Culprit] | str]] = []
                result = _undecided(get, result, group.alternatives.get(addr, []), ops,
                                    group.base, options)
                if options:
                    choices.append(Choice(addr, left, tuple(options)))
            if isinstance(result, str):
                unknown[result] = unknown.get(result, 0) + left
                continue
            for culprit in result:
                culprit = found.setdefault(culprit.key(), culprit)
                # a keeper's own missing put (not a consumer it was handed to)
                if culprit.kind == MISSING_PUT and not culprit.last_use \
                        and culprit.frames and culprit.function == culprit.frames[-1]:
                    culprit.last_use = last_use(get, len(culprit.frames) - 1, ops)
                culprit.leaked_objects.add(addr)
                culprit.references += left
    culprits = _ranked(found.values(), group.base.released)
    return dataclasses.replace(_verdict(culprits, unknown), choices=tuple(choices),
                               unattributed=sum(unknown.values()))


def last_use(get: PathOp, i: int, ops: list[PathOp]) -> tuple[Frame, ...]:
    """The path, up to the keeper (frame i of the get's path), of the object's last
    operation made under the keeper's call on the same outer path: the keeper's
    frame there is the call after which the reference was dropped (issue 31: name
    the exit path's line, not only the function).  () when the operations are not
    timed, or when the last one is the get itself (nothing later to point at)."""
    outer = get.path[i:]
    n = len(outer)
    under = [op for op in ops if op.last_ns and len(op.path) >= n and op.path[-n:] == outer]
    if not under:
        return ()
    last = max(under, key=lambda op: (op.last_ns, op.path))
    k = len(last.path) - n
    if last is get or last.frames[k].vaddr == get.frames[i].vaddr:
        return ()
    return last.frames[:k + 1]


def _undecided(get: PathOp, result: list[Culprit], alternatives: list[PathOp],
               ops: list[PathOp], base: Baseline,
               options: list[tuple[PathOp, list[Culprit] | str]]) -> list[Culprit] | str:
    """Why no culprit can be named when another get of the object could as well be
    the one left without a put and leads to another function (references of one
    object are exchangeable: counts say how many stayed, not which); else the
    culprits found."""
    if get not in alternatives or len(alternatives) < 2:
        return result
    named: dict[str, list[str]] = {}
    tried: list[tuple[PathOp, list[Culprit] | str]] = []
    for other in alternatives:
        found = verdict(other, ops, base) if other is not get else result
        tried.append((other, found))
        # a get whose own culprit cannot be named is another outcome too
        for label in [frame_name(c.function) for c in found] if isinstance(found, list) \
                else ["no function named"]:
            named.setdefault(label, []).append(short_frames(other.frames, 2))
    if len(named) <= 1:  # all lead to one function, which only a guess may show
        held = len(result[0].frames) if result else 0  # the culprit's: the get's, up to it
        guess = leaks_only(get, held - 1, base) if held and \
            result[0].frames == get.frames[:held] else ""
        return guess or result
    options.extend(tried)  # what the holders at the scan may decide (holderevidence.py)
    seen = "; ".join(f"{name} (get at {', '.join(at)})" for name, at in sorted(named.items()))
    return (f"{len(alternatives)} gets of the object pair off with its puts equally well, "
            f"and which one stayed is not decided by the counts; each leads to another "
            f"function: {seen}; the object's order of gets and puts would decide")


def _ranked(found: Iterable[Culprit], released: list[PathOp]) -> list[Culprit]:
    for culprit in found:
        culprit.objects = len(culprit.leaked_objects)
        prefix = tuple(func_key(f) for f in culprit.frames)
        culprit.released_uses = sum(op.count for op in released
                                    if is_get(op.op) and op.path[:len(prefix)] == prefix)
    return sorted(found, key=lambda c: (-c.objects, -c.references, c.released_uses,
                                        c.function.function))


GAPS_SHOWN = 3  # reasons in a verdict's text, most references first


def _verdict(culprits: list[Culprit], unknown: dict[str, int]) -> Verdict:
    common = sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))
    gaps = tuple(f"{n} unmatched reference(s) not attributed: {why}"
                 for why, n in common[:GAPS_SHOWN])
    if len(common) > GAPS_SHOWN:
        rest = sum(n for _, n in common[GAPS_SHOWN:])
        gaps += (f"{rest} more unmatched reference(s) not attributed, for "
                 f"{len(common) - GAPS_SHOWN} other reason(s)",)
    if not culprits:
        if gaps:
            return Verdict(UNKNOWN, "; ".join(gaps))
        return Verdict(UNKNOWN, "no get was left without a put in the recorded history")
    top = culprits[0]
    rank = (top.objects, top.references, top.released_uses)
    level = [c for c in culprits if (c.objects, c.references, c.released_uses) == rank]
    names = sorted({frame_name(c.function) for c in level} | set(top.tie))
    if len(names) > 1:
        return Verdict(TIE, f"{len(names)} functions have the same evidence: "
                       f"{', '.join(names)}", culprits, gaps)
    for c in level:  # one function, several paths to it: no tie of one
        c.tie = ()
    return Verdict(FOUND, top.why, culprits, gaps)


def attribute(objects: list[tuple[int, list[PathOp]]], released: list[PathOp]) -> list[Culprit]:
    """Culprits of a leak group: `objects` are (address, operations) of its leaked objects."""
    group = PairedGroup.of(objects, released)
    return judge(group, {addr: unmatched for addr, _, unmatched in group.objects}).culprits
