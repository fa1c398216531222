"""Ownership between leaked objects and the verdict's gaps (pure logic; the BPF
test on real programs is tests/bpf/test_culprits.py)."""

from __future__ import annotations

from refcntd.analysis.judging import PairedGroup
from refcntd.analysis.model import LeakedObject, LeakGroup
from refcntd.analysis.ownership import CYCLE, DIRECT, INDIRECT, Leaked, ownership
from refcntd.analysis.pairing import pair, put_wrappers
from refcntd.analysis.pathops import PathOp
from refcntd.analysis.verdicts import Evidence, evidence_gap, judge_process
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

INIT, GET, PUT = Role.INIT, Role.GET, Role.PUT


def op(kind: Role, names: str, count: int = 1, at: int = 0) -> PathOp:
    frames = tuple(Frame("/bin/prog", 0x1000 + i, n) for i, n in enumerate(names.split()))
    return PathOp(kind, frames, count, at, at)


def leaked(addr: int, type_name: str, init_ns: int, ops: list[PathOp],
           released: list[PathOp]) -> Leaked:
    group = PairedGroup.of([(addr, ops)], released)
    ((_, _, unmatched),) = group.objects
    return Leaked(addr, type_name, init_ns, group, ops, unmatched)


def test_reference_taken_in_owner_constructor_is_held_by_the_owner() -> None:
    owner = leaked(1, "owner", 10, [op(INIT, "owner_alloc owner_new run main", at=10)],
                   [op(INIT, "owner_alloc owner_new run main", 2),
                    op(PUT, "owner_put run main", 2)])
    child = leaked(2, "child", 5, [op(INIT, "child_alloc run main", at=5),
                                   op(GET, "child_get owner_new run main", 3, at=11),
                                   op(PUT, "child_put drop owner_put run main", 2),
                                   op(PUT, "child_put run main")], [])
    own = ownership([owner, child])
    assert own.leak == {1: DIRECT, 2: INDIRECT}
    assert [(h.holder, h.held, h.references) for h in own.holdings] == [(1, 2, 1)]
    assert own.roots == {2: {1}}
    assert own.free[2] == []


def test_two_objects_holding_each_other_are_one_cycle() -> None:
    """cycle.c's pattern: pair_new hands b's creation reference to a, and b's
    constructor takes one to a; main put its own reference to a."""
    a = leaked(1, "a", 10, [op(INIT, "a_new pair_new main", at=10),
                            op(GET, "a_get b_new pair_new main", at=12),
                            op(PUT, "a_put main", at=13)],
               [op(INIT, "a_new pair_new main", 2), op(GET, "a_get b_new pair_new main", 2),
                op(PUT, "a_put b_put pair_break main", 2), op(PUT, "a_put main", 2)])
    b = leaked(2, "b", 11, [op(INIT, "b_new pair_new main", at=11)],
               [op(INIT, "b_new pair_new main", 2), op(PUT, "b_put pair_break main", 2)])
    own = ownership([a, b])
    assert own.leak == {1: CYCLE, 2: CYCLE}
    assert own.cycles == [(1, 2)]


def test_siblings_from_one_constructor_do_not_hold_each_other() -> None:
    """Two leaked holders made by the same function: neither holds the other's
    creation reference (a get inside holder_new is not holder_new's object's)."""
    released = [op(INIT, "holder_alloc holder_new run main"), op(PUT, "holder_put run main")]
    h1 = leaked(1, "holder", 10, [op(INIT, "holder_alloc holder_new run main", at=10)],
                released)
    h2 = leaked(2, "holder", 20, [op(INIT, "holder_alloc holder_new run main", at=20)],
                released)
    own = ownership([h1, h2])
    assert own.leak == {1: DIRECT, 2: DIRECT}
    assert own.holdings == []


def test_initial_reference_pairs_with_the_callers_own_put() -> None:
    """run() puts its pool's reference itself; consume() hands a produced one to
    obj_put(): the init pairs with run's put, the produced get with consume's."""
    released = [op(INIT, "obj_alloc run main"), op(GET, "obj_get produce run main"),
                op(PUT, "obj_put consume run main"), op(PUT, "obj_put run main")]
    left, matches = pair(released, set(), put_wrappers(released))
    assert left == []
    assert {(g.frames[1].function, p.frames[1].function) for g, p, _ in matches} == \
        {("run", "run"), ("produce", "consume")}


def test_evidence_gap_says_what_does_not_add_up() -> None:
    ops = [op(GET, "obj_get f main", 3), op(PUT, "obj_put f main", 2)]
    assert evidence_gap(3, 2, ops, 0, 0) == ""
    assert evidence_gap(4, 2, ops, 0, 0) == "recorded paths hold 3 of 4 gets and 2 of 2 puts"
    assert "5 operations not counted (path map full)" in evidence_gap(3, 2, ops, 5, 0)
    assert "without a stack" in evidence_gap(3, 2, ops, 0, 1)


def test_a_group_without_usable_evidence_says_why() -> None:
    """Never a silent gap: one object's paths do not add up, the other has no
    history at all: the verdict is unknown, with both reasons and counts."""
    group = LeakGroup("t", (Frame("/bin/prog", 1, "t_new"),),
                      [LeakedObject(1, 1, 4, 3, 0), LeakedObject(2, 1, 0, 0, 0)])
    ops = [op(INIT, "t_new main"), op(GET, "t_get f main", 3), op(PUT, "t_put f main", 3)]
    gap = evidence_gap(4, 3, ops, 0, 0)
    judge_process([group], {group.key(): [Evidence(1, "t", 0, ops, gap)]}, {})
    assert group.verdict is not None and group.verdict.status == "unknown"
    assert group.culprits == []
    assert "1 of 1 objects not attributed: recorded paths hold 3 of 4 gets" in \
        group.verdict.reason
    assert "1 object(s) of this group have no history (see the losses)" in group.verdict.notes


def test_a_caller_of_a_constructor_wrapper_that_builds_its_own_object_keeps_the_child():
    """perf's map__new: nsinfo__copy builds the nsinfo, map__new takes a dso reference
    for the map it builds (and inits); the leaked dso is not held by the leaked nsinfo."""
    nsinfo = leaked(1, "nsinfo", 10, [op(INIT, "nsinfo__copy map__new process main", at=10)],
                    [op(INIT, "nsinfo__copy map__new process main", 2),
                     op(PUT, "nsinfo__put dso__delete exit main", 2)])
    dso = leaked(2, "dso", 5, [op(INIT, "dso__new findnew process main", at=5),
                               op(PUT, "dso__put process main", at=6),
                               op(GET, "dso__get map__new process main", at=11)], [])
    ctors = frozenset({("prog", "nsinfo__copy"), ("prog", "dso__new"), ("prog", "map__new")})
    assert ownership([nsinfo, dso], ctors).leak[2] == DIRECT
    assert ownership([nsinfo, dso]).leak[2] == INDIRECT  # without knowing map__new builds


def test_the_same_events_in_another_order_give_the_same_verdict() -> None:
    """The kernel's maps are walked in no fixed order: judge_process sorts first."""
    ops = [op(INIT, "t_new main"), op(GET, "t_get f main"), op(GET, "t_get g main"),
           op(PUT, "t_put f main"), op(PUT, "t_put main")]
    verdicts = []
    for order in (ops, ops[::-1]):
        group = LeakGroup("t", (Frame("/bin/prog", 0x1000, "t_new"),),
                          [LeakedObject(1, 1, 2, 2, 0)])
        judge_process([group], {group.key(): [Evidence(1, "t", 0, list(order))]}, {})
        assert group.verdict is not None
        verdicts.append((group.verdict.status, [c.function.function for c in group.culprits]))
    assert verdicts[0] == verdicts[1] == ("culprit", ["g"])
