"""A process's leak groups judged together: ownership first, then culprits.

Objects held by other leaked objects are not blamed on their own code: they
are indirect leaks, and their group points at the holder's culprit.  Every
group with history gets a Verdict; where no culprit can be named it says
why, with counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from refcntd.analysis.attribution import UNKNOWN
from refcntd.analysis.calibration import calibrate
from refcntd.analysis.judging import PairedGroup, Verdict, judge
from refcntd.analysis.model import Holder, LeakedObject, LeakGroup, LeakKey
from refcntd.analysis.ownership import (
    CYCLE,
    INDIRECT,
    Holding,
    Leaked,
    Ownership,
    ownership,
)
from refcntd.analysis.pathops import Culprit, FuncKey, PathOp
from refcntd.kernel.abi import Role


@dataclass(frozen=True)
class Evidence:
    """One leaked object's history as the analysis needs it."""

    address: int
    type_name: str
    init_ns: int
    ops: list[PathOp]
    gap: str = ""  # why its paths cannot be trusted ("" when they add up)


def evidence_gap(gets: int, puts: int, ops: list[PathOp], lost: int, unwalked: int) -> str:
    """Whether the per-path counts account for every get and put of the object."""
    if lost:
        return f"{lost} operations not counted (path map full)"
    if unwalked:
        return (f"{unwalked} operations without a stack (the stack store refused it: "
                "collision or full), their paths unknown")
    got = sum(op.count for op in ops if op.op == Role.GET)
    put = sum(op.count for op in ops if op.op == Role.PUT)
    if (got, put) != (gets, puts):
        return f"recorded paths hold {got} of {gets} gets and {put} of {puts} puts"
    return ""


def judge_process(groups: list[LeakGroup], evidence: dict[LeakKey, list[Evidence]],
                  released: dict[LeakKey, list[PathOp]]) -> None:
    """Set every group's verdict and culprits and every object's leak kind.

    Operations come in the order the kernel's maps were walked, which differs
    from run to run; pairing and ties take the first of equals, so they are put
    in one canonical order first: the same events give the same verdict."""
    evidence = {key: [dataclasses.replace(e, ops=sorted(e.ops, key=_op_order))
                      for e in sorted(evs, key=lambda e: e.address)]
                for key, evs in sorted(evidence.items(), key=lambda kv: kv[0])}
    callers = _stub_callers(evidence)
    released = {key: sorted(_own_type(ops, key[0], callers), key=_op_order)
                for key, ops in released.items()}
    paired = {key: PairedGroup.of([(e.address, e.ops) for e in evs if not e.gap],
                                  released.get(key, []), key[0])
              for key, evs in evidence.items()}
    leaked = [Leaked(addr, e.type_name, e.init_ns, paired[key], ops, unmatched)
              for key, evs in evidence.items()
              for e, (addr, ops, unmatched) in zip([e for e in evs if not e.gap],
                                                   paired[key].objects, strict=True)]
    own = ownership(leaked, _constructors(evidence, released))
    by_key = {g.key(): g for g in groups}
    types = {o.address: o.type_name for o in leaked}
    held_by: dict[int, list[Holding]] = {}
    for h in own.holdings:
        held_by.setdefault(h.held, []).append(h)
    for key, evs in evidence.items():
        group = by_key[key]
        addrs = {e.address for e in evs if not e.gap}
        free = {a: own.free[a] for a in addrs}
        verdict = _with_gaps(judge(paired[key], free), evs, own, addrs)
        group.verdict = _without_history(verdict, len(group.objects) - len(evs))
        group.culprits = group.verdict.culprits
        group.objects = [_annotated(o, own, types, held_by) for o in group.objects]
    calibrate(groups)  # before indirect groups take their holders' culprits
    _point_to_holders(groups, own)


def _stub_callers(evidence: dict[LeakKey, list[Evidence]]) -> dict[str, set[FuncKey]]:
    """Per type: the functions that made the leaked objects' operations (path[0])."""
    out: dict[str, set[FuncKey]] = {}
    for key, evs in evidence.items():
        out.setdefault(key[0], set()).update(op.path[0] for e in evs for op in e.ops
                                             if op.path)
    return out


def _own_type(ops: list[PathOp], type_name: str, callers: dict[str, set[FuncKey]]
              ) -> list[PathOp]:
    """Released operations of this type only.  Objects typed by the name they pass to
    the stubs share one kernel type; before released sites were keyed by that name,
    a dso's released paths arrived mixed with the maps' and threads' (runs saved by
    REFCNTD_DUMP_EVIDENCE then still do).  An operation made by a function that, in
    the leaked objects, only ever operates on another type (map__put, thread__new)
    is dropped."""
    own = callers.get(type_name, set())
    foreign = set().union(*(f for t, f in callers.items() if t != type_name)) - own
    return [op for op in ops if not (op.path and op.path[0] in foreign)]


def _op_order(op: PathOp) -> tuple[int, tuple[tuple[str, str, int], ...], int, int]:
    return (int(op.op), tuple(f.key() for f in op.frames), op.count, op.first_ns)


def _constructors(evidence: dict[LeakKey, list[Evidence]],
                  released: dict[LeakKey, list[PathOp]]) -> frozenset[FuncKey]:
    """Functions that call init (of every type this process judges)."""
    ops = [op for evs in evidence.values() for e in evs for op in e.ops]
    ops += [op for rel in released.values() for op in rel]
    return frozenset(op.path[0] for op in ops if op.op == Role.INIT and op.path)


def _without_history(verdict: Verdict, missing: int) -> Verdict:
    """Objects of the group that have no history at all (history map full)."""
    if missing <= 0:
        return verdict
    note = f"{missing} object(s) of this group have no history (see the losses)"
    return dataclasses.replace(verdict, notes=(*verdict.notes, note))


def _with_gaps(verdict: Verdict, evs: list[Evidence], own: Ownership, addrs: set[int]
               ) -> Verdict:
    held = [a for a in addrs if own.leak.get(a) in (INDIRECT, CYCLE)]
    gaps = [e for e in evs if e.gap]
    notes = list(verdict.notes)
    if held and len(held) < len(evs):
        notes.append(f"{len(held)} of {len(evs)} objects are held only by leaked objects")
    if gaps:
        notes.append(f"{len(gaps)} of {len(evs)} objects not attributed: {gaps[0].gap}"
                     + (" (and others)" if len(gaps) > 1 else ""))
    if not verdict.culprits and held and len(held) == len(addrs):
        kind = CYCLE if all(own.leak[a] == CYCLE for a in held) else INDIRECT
        return Verdict(kind, "", [], tuple(notes))
    if not verdict.culprits and not addrs:
        return Verdict(UNKNOWN, "; ".join(notes))
    return dataclasses.replace(verdict, notes=tuple(notes))


def _annotated(obj: LeakedObject, own: Ownership, types: dict[int, str],
               held_by: dict[int, list[Holding]]) -> LeakedObject:
    kind = own.leak.get(obj.address, "")
    holders = tuple(Holder(h.holder, types.get(h.holder, ""), h.references, h.get.frames)
                    for h in held_by.get(obj.address, ()))
    cycle = next((c for c in own.cycles if obj.address in c), ())
    return dataclasses.replace(obj, leak=kind, held_by=holders, cycle=cycle)


def _point_to_holders(groups: list[LeakGroup], own: Ownership) -> None:
    """Indirect groups name the culprit of the leaked objects that hold them."""
    owner_group = {o.address: g for g in groups for o in g.objects}
    for group in groups:
        if group.verdict is None or group.verdict.status not in (INDIRECT, CYCLE):
            continue
        roots = sorted({r for o in group.objects for r in own.roots.get(o.address, ())})
        culprits: list[Culprit] = []
        for root in roots:
            holder = owner_group.get(root)
            if holder is None or holder is group or not holder.culprits:
                continue
            top = holder.culprits[0]
            culprits.append(dataclasses.replace(
                top, leaked_objects=set(top.leaked_objects),
                holder=f"{holder.type_name} 0x{root:x}"))
        group.culprits = culprits
        text = ", ".join(f"'{owner_group[r].type_name}' 0x{r:x}" for r in roots
                         if r in owner_group)
        what = ("they hold each other and nothing else holds them: break the cycle"
                if group.verdict.status == CYCLE else
                f"held only by leaked {text}: fixing that leak fixes this one")
        group.verdict = Verdict(group.verdict.status, what, culprits, group.verdict.notes)
