"""Attribution logic on hand-written paths (pure logic; the BPF test is in test_history)."""

from __future__ import annotations

from refcntd.analysis.attribution import Baseline, verdict
from refcntd.analysis.judging import attribute
from refcntd.analysis.pairing import reference_sources
from refcntd.analysis.pathops import EXTRA_GET, MISSING_PUT, PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def path(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame("/bin/prog", 0x1000 + i, name) for i, name in enumerate(names))


INIT, GET, PUT = Role.INIT, Role.GET, Role.PUT


def op(kind: Role, names: str, count: int = 1) -> PathOp:
    return PathOp(kind, path(*names.split()), count)


# Masami Hiramatsu's example: funcA gets and returns; funcB never puts what it got
# from funcA; funcC gets once more than it puts.  funcD is a correct caller.
RELEASED = [op(INIT, "obj_new make_d main", 3), op(GET, "funcA funcD main", 6),
            op(PUT, "funcD main", 6), op(PUT, "release main", 3)]


def test_getters_and_constructors_are_reference_sources():
    sources = reference_sources(RELEASED)
    assert ("prog", "funcA") in sources and ("prog", "obj_new") in sources
    assert ("prog", "funcD") not in sources and ("prog", "main") not in sources


def test_funcB_path_is_a_missing_put():
    leaked = [op(INIT, "obj_new make_b main"), op(GET, "funcA funcB main"),
              op(GET, "funcA funcD main", 2), op(PUT, "funcD main", 2),
              op(PUT, "release main")]
    (culprit,) = attribute([(0x10, leaked)], RELEASED)
    assert culprit.kind == MISSING_PUT and culprit.function.function == "funcB"
    assert [f.function for f in culprit.frames] == ["funcA", "funcB"]
    assert (culprit.objects, culprit.references, culprit.released_uses) == (1, 1, 0)


def test_funcC_extra_get_is_named_as_such():
    leaked = [op(INIT, "obj_new make_c main"), op(GET, "funcA funcC main"),
              op(GET, "funcC main"), op(PUT, "funcC main"),
              op(GET, "funcA funcD main"), op(PUT, "funcD main"), op(PUT, "release main")]
    (culprit,) = attribute([(0x20, leaked)], RELEASED)
    assert culprit.kind == EXTRA_GET and culprit.function.function == "funcC"
    assert [f.function for f in culprit.frames] == ["funcC"]


def test_ranking_by_leaked_objects_then_references():
    a = [op(INIT, "obj_new make_b main"), op(GET, "funcA funcB main", 5),
         op(PUT, "release main")]
    b = [op(INIT, "obj_new make_b main"), op(GET, "funcA funcE main"),
         op(PUT, "release main")]
    c = [op(INIT, "obj_new make_b main"), op(GET, "funcA funcB main"),
         op(PUT, "release main")]
    culprits = attribute([(1, a), (2, b), (3, c)], RELEASED)
    assert [(c.function.function, c.objects, c.references) for c in culprits] == [
        ("funcB", 2, 6), ("funcE", 1, 1)]


def test_never_released_initial_reference_is_a_missing_put_of_its_owner():
    """funcD's put balances funcA's get; main never drops the reference it created."""
    leaked = [op(INIT, "obj_new make_d main"), op(GET, "funcA funcD main"),
              op(PUT, "funcD main")]
    (culprit,) = attribute([(1, leaked)], RELEASED)
    assert (culprit.kind, culprit.function.function) == (MISSING_PUT, "main")


def test_without_released_objects_matched_pairs_reveal_getters():
    """No baseline: funcA's matched get (put in funcD) shows funcA hands references up."""
    leaked = [op(INIT, "obj_new make_b main"), op(GET, "funcA funcB main"),
              op(GET, "funcA funcD main"), op(PUT, "funcD main"), op(PUT, "release main")]
    (culprit,) = attribute([(1, leaked)], released=[])
    assert (culprit.kind, culprit.function.function) == (MISSING_PUT, "funcB")


def test_put_wrappers_are_reference_sinks():
    from refcntd.analysis.pairing import reference_sinks
    assert reference_sinks(RELEASED) == {("prog", "release")}


def test_a_getter_called_once_is_skipped_by_its_name():
    """perf's kernel dso: dsos__find_kernel_dso gets and returns, once per run, so no
    released object teaches that it hands references up; machine__process_kernel_mmap_event
    dropped its put (a real-code mutant)."""
    get = op(GET, "dso__get dsos__find_kernel_dso machine__process_kernel_mmap_event main")
    (culprit,) = verdict(get, [op(INIT, "dso_new dsos_add main"), get], Baseline.of([]))
    assert culprit.kind == MISSING_PUT
    assert culprit.function.function == "machine__process_kernel_mmap_event"
    assert [f.function for f in culprit.frames][:2] == ["dso__get", "dsos__find_kernel_dso"]


def test_a_getter_name_does_not_hide_a_function_that_puts_more_than_it_gets():
    released = [op(INIT, "obj_new main", 2), op(GET, "obj_get main", 2),
                op(PUT, "obj_put get_rid main", 4)]
    get = op(GET, "obj_get get_rid main")
    (culprit,) = verdict(get, [op(INIT, "obj_new main"), get], Baseline.of(released))
    assert culprit.function.function == "get_rid"


def test_a_function_without_a_symbol_is_never_the_culprit():
    frames = (Frame("/bin/prog", 0x1000, "obj_get"), Frame("/lib/libx.so", 0x7f6aa),
              Frame("/bin/prog", 0x1010, "main"))
    get = PathOp(GET, frames, 1)
    found = verdict(get, [op(INIT, "obj_new main"), get], Baseline.of([]))
    assert isinstance(found, str) and "without a symbol (0x7f6aa" in found
