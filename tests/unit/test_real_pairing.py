"""Pairing and hand-over rules that real code showed wrong (issue 31,
benchmarks/mutants); the BPF side is tests/bpf/test_real_ownership.py."""

from __future__ import annotations

from refcntd.analysis.attribution import UNKNOWN
from refcntd.analysis.judging import PairedGroup, judge
from refcntd.analysis.pathops import PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def op(role: Role, path: str, count: int = 1, t: int = 0) -> PathOp:
    return PathOp(role, tuple(Frame("prog", 0x1000 + i, n) for i, n in enumerate(path.split())),
                  count, first_ns=t, last_ns=t)


def judged(objects: list[list[PathOp]], released: list[PathOp] | None = None):  # type: ignore[no-untyped-def]
    group = PairedGroup.of(list(enumerate(objects, 1)), released or [])
    return judge(group, {addr: left for addr, _, left in group.objects})


def test_the_objects_own_api_is_not_an_owner() -> None:
    """perf's machine__process_mmap2_event: map__new's initial reference is never put;
    the maps container's reference (got in __maps__insert_sorted, which calls the
    stub itself) is put by maps__put.  map__new and map__put share only the map's own
    API: pairing them made the container's get the leftover."""
    ops = [op(Role.INIT, "map__new process_mmap main", t=1),
           op(Role.GET, "__maps__insert_sorted maps__insert process_mmap main", t=2),
           op(Role.PUT, "map__put maps__put thread__delete main", t=3)]
    verdict = judged([ops])
    assert verdict.status == "culprit", verdict
    top = verdict.culprits[0]
    assert (top.kind, top.function.function) == ("missing put", "process_mmap")


def _hand_over(extra: list[PathOp]):  # type: ignore[no-untyped-def]
    """Released objects got a reference in report() and handed it to show(), which
    put it; the leaked one's stayed.  `extra`: the leaked object's other operations."""
    released = [op(Role.INIT, "t_new main"), op(Role.PUT, "t_put main"),
                op(Role.GET, "t_get report main"), op(Role.PUT, "t_put show report main")]
    ops = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
           op(Role.GET, "t_get report main", t=2), *extra]
    return judged([ops], released)


def test_a_consumer_that_used_the_object_is_where_it_was_handed() -> None:
    verdict = _hand_over([op(Role.GET, "t_get dump report main", t=3),
                          op(Role.PUT, "t_put dump report main", t=4)])
    assert verdict.status == "culprit", verdict
    assert verdict.culprits[0].function.function == "dump"
    # the last-use line is the keeper's own (its frame on its last call): not for a
    # consumer the reference was handed to
    assert verdict.culprits[0].last_use == ()


def test_a_keepers_missing_put_comes_after_its_last_call_that_touched_the_object() -> None:
    ops = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
           op(Role.GET, "t_get keep main", t=2), op(Role.GET, "t_get use keep main", t=3),
           op(Role.PUT, "t_put use keep main", t=4), op(Role.GET, "t_get peek keep main", t=5),
           op(Role.PUT, "t_put peek keep main", t=6)]
    verdict = judged([ops])
    top = verdict.culprits[0]
    assert (top.kind, top.function.function) == ("missing put", "keep")
    assert [f.function for f in top.last_use] == ["t_put", "peek", "keep"]


def test_a_call_that_only_got_references_was_not_handed_one() -> None:
    """perf's hist_entry__init mutant: the call below the holder that a get went
    through (hist_entry__new storing one) was taken for the consumer the
    reference was handed to.  Nothing shows where it went: unknown."""
    verdict = _hand_over([op(Role.GET, "t_get entry__new report main", t=3)])
    assert verdict.status == UNKNOWN, verdict
    assert ("this one stayed on its way to report, and no function of the object's "
            "history below it shows where") in verdict.reason, verdict.reason
