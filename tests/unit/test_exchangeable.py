"""Leftover references that counts cannot tell apart (issue 31): which get of an
object stayed without a put is decided by pairing; when another choice pairs
the rest as well and leads elsewhere, the verdict says so instead of naming
one function.  And a function's references kept in the leaked objects weigh
against the ones it seemed to hand up."""

from __future__ import annotations

from refcntd.analysis.attribution import UNKNOWN
from refcntd.analysis.judging import PairedGroup, judge
from refcntd.analysis.pairing import equal_leftovers
from refcntd.analysis.pathops import PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def op(role: Role, path: str, count: int = 1, t: int = 0) -> PathOp:
    return PathOp(role, tuple(Frame("prog", 0x1000 + i, n) for i, n in enumerate(path.split())),
                  count, first_ns=t, last_ns=t)


def judged(objects: list[list[PathOp]]):  # type: ignore[no-untyped-def]
    group = PairedGroup.of(list(enumerate(objects, 1)), [])
    return judge(group, {addr: left for addr, _, left in group.objects})


def test_two_gets_with_one_put_between_them_are_not_decided() -> None:
    ops = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
           op(Role.GET, "t_get f main", t=2), op(Role.GET, "t_get g main", t=3),
           op(Role.PUT, "t_put consume main", t=4)]
    assert {o.frames[1].function for o in equal_leftovers(ops, set())} == {"f", "g"}
    verdict = judged([ops])
    assert verdict.status == UNKNOWN
    assert "2 gets of the object pair off with its puts equally well" in verdict.reason
    # f handed its reference up in the pairing kept, so its get leads to main
    assert "main (get at t_get < f < ...)" in verdict.reason
    assert "g (get at t_get < g < ...)" in verdict.reason


def test_a_get_that_nests_with_its_put_is_not_a_candidate() -> None:
    """f's own put pairs with f's get (deepest shared caller): g's is the leftover."""
    ops = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
           op(Role.GET, "t_get f main", t=2), op(Role.PUT, "t_put f main", t=3),
           op(Role.GET, "t_get g main", t=4)]
    assert [o.frames[1].function for o in equal_leftovers(ops, set())] == ["g"]
    verdict = judged([ops])
    assert (verdict.status, verdict.culprits[0].function.function) == ("culprit", "g")


def test_references_kept_outweigh_the_ones_that_seemed_handed_up() -> None:
    """Three objects keep load_sym's reference; in one it paired with a consumer's put
    far up (so it looked handed up): load_sym is the culprit, not its caller."""
    kept = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
            op(Role.GET, "t_get load_sym map_load main", t=2)]
    looked_up = [*kept, op(Role.GET, "t_get lookup main", t=3),
                 op(Role.PUT, "t_put consume main", t=4)]
    verdict = judged([kept, kept, kept, looked_up])
    top = verdict.culprits[0]
    assert (top.function.function, len(top.leaked_objects)) == ("load_sym", 3)


def test_handed_up_as_often_as_kept_is_still_a_getter() -> None:
    """Without released objects a matched pair is the only evidence that a function
    hands references up: one handed up against one kept keeps it a getter."""
    verdict = judged([[op(Role.INIT, "t_new make main", t=1), op(Role.PUT, "release main", t=9),
                       op(Role.GET, "funcA funcB main", t=2), op(Role.GET, "funcA funcD main", t=3),
                       op(Role.PUT, "funcD main", t=4)]])
    assert verdict.culprits[0].function.function == "funcB"


def _extra_get_group(released: list[PathOp]):  # type: ignore[no-untyped-def]
    """report() puts the object once but got two references through find()."""
    ops = [op(Role.INIT, "t_new main", t=1), op(Role.PUT, "t_put main", t=9),
           op(Role.GET, "t_get find report main", 2, t=2), op(Role.PUT, "t_put report main", t=3)]
    group = PairedGroup.of([(1, ops)], released)
    return judge(group, {addr: left for addr, _, left in group.objects})


def test_an_extra_get_through_an_unproven_callee_is_not_decided() -> None:
    """Released objects show t_put as the put wrapper (report owns its put), and
    nothing about what find hands up."""
    verdict = _extra_get_group([op(Role.INIT, "t_new main"), op(Role.PUT, "t_put main")])
    assert verdict.status == UNKNOWN
    assert "whether its own get is the extra one or find handed it a reference too many" \
        in verdict.reason


def test_an_extra_get_through_callees_released_objects_show_handing_up() -> None:
    """Released objects got references through find() and their callers put them:
    find hands exactly what it gets up, so report() got one too many itself."""
    released = [op(Role.INIT, "t_new main"), op(Role.PUT, "t_put main"),
                op(Role.GET, "t_get find show main"), op(Role.PUT, "t_put show main")]
    verdict = _extra_get_group(released)
    assert verdict.status == "culprit"
    top = verdict.culprits[0]
    assert (top.kind, top.function.function) == ("extra get", "report")


def at(role: Role, sites: str, count: int = 1) -> PathOp:
    """Frames as name@vaddr: two gets of one call differ only in a return address."""
    frames = tuple(Frame("prog", int(v, 16), n, offset=int(v, 16) & 0xff)
                   for n, v in (s.split("@") for s in sites.split()))
    return PathOp(role, frames, count)


def _two_gets_per_call(released: list[PathOp]):  # type: ignore[no-untyped-def]
    """find() took two references per call (sites 0x110 and 0x120); report puts one."""
    ops = [at(Role.INIT, "t_new@10 main@900"), at(Role.PUT, "t_put@20 main@910"),
           at(Role.GET, "t_get@30 find@110 report@500 main@920"),
           at(Role.GET, "t_get@30 find@120 report@500 main@920"),
           at(Role.PUT, "t_put@20 report@510 main@920")]
    group = PairedGroup.of([(1, ops)], released)
    return judge(group, {addr: left for addr, _, left in group.objects})


def test_a_call_that_took_two_references_is_not_decided() -> None:
    verdict = _two_gets_per_call([])
    assert verdict.status == UNKNOWN
    assert "find took two references in one call (at +0x10, +0x20, 1 time(s) each)" \
        in verdict.reason
    assert "whether find took one too many or report kept one it should have put" \
        in verdict.reason


def test_a_function_that_always_takes_two_is_not_suspected() -> None:
    """perf's threads__find keeps one reference in its last-match cache and returns
    one: released objects went through both sites, so report's missing put is named."""
    released = [at(Role.INIT, "t_new@10 main@900"),
                at(Role.GET, "t_get@30 find@110 show@600 main@930"),
                at(Role.GET, "t_get@30 find@120 show@600 main@930"),
                at(Role.PUT, "t_put@20 show@610 main@930"),
                at(Role.PUT, "t_put@20 purge@700 main@940"), at(Role.PUT, "t_put@20 main@910")]
    verdict = _two_gets_per_call(released)
    assert verdict.status == "culprit", verdict
    assert verdict.culprits[0].function.function == "report"
