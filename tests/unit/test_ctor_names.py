"""Who kept a new object when no object of its kind was released (issue 41): the
functions that made it are skipped only when their names say they make objects;
an object got from a constructor probed at its return by a function whose name
says nothing is "unknown" (fontconfig: FcSortWalk kept its charset, FcNameParse
returned its pattern, and the old rule blamed the caller in both)."""

from __future__ import annotations

from refcntd.analysis.apinames import name_words, named_constructor
from refcntd.analysis.attribution import Baseline, verdict
from refcntd.analysis.pathops import MISSING_PUT, PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def op(kind: Role, names: str) -> PathOp:
    return PathOp(kind, tuple(Frame("/lib/libfc.so", 0x1000 + i, n)
                              for i, n in enumerate(names.split())), 1)


def test_camel_case_names_have_words() -> None:
    assert name_words(("libfc.so", "IA__FcPatternDuplicate")) == ["ia", "fc", "pattern",
                                                                 "duplicate"]
    assert name_words(("perf", "__maps__insert_sorted.isra.0")) == ["maps", "insert", "sorted"]


def test_constructors_by_name() -> None:
    made = ["map__new2", "map__init", "nsinfo__alloc", "g_object_new", "FcPatternDuplicate",
            "FcCharSetCopy", "gst_buffer_list_init"]
    assert all(named_constructor(("m", n)) for n in made)
    assert not any(named_constructor(("m", n)) for n in ("FcSortWalk", "FcNameParse", "main"))


def test_an_unnamed_maker_of_an_object_nobody_released_is_unknown() -> None:
    init = op(Role.INIT, "FcSortWalk FcFontSetSort FcFontSort main")
    found = verdict(init, [init], Baseline.of([]))
    assert isinstance(found, str)
    assert "whether FcSortWalk kept it or returned it to FcFontSetSort" in found


def test_main_that_made_an_object_nobody_released_keeps_it() -> None:
    """main returns nothing anyone keeps (tests/bpf/test_history's manygets)."""
    init = op(Role.INIT, "main __libc_start_call_main __libc_start_main_impl _start")
    (culprit,) = verdict(init, [init], Baseline.of([]))
    assert culprit.kind == MISSING_PUT and culprit.function.function == "main"


def test_a_named_maker_and_the_one_it_is_inlined_into_are_skipped() -> None:
    """perf: map__init inlined into map__new2 (one frame, two functions), called by
    the function that kept the map, which used it after map__new2 returned (a get
    and a put under maps__insert: an object that never left its maker's call is
    unknown, test_maker_call.py)."""
    frames = (Frame("/bin/perf", 0x10, "map__init"), Frame("/bin/perf", 0x10, "map__new2"),
              Frame("/bin/perf", 0x20, "machine__process_mmap_event"),
              Frame("/bin/perf", 0x30, "main"))
    init = PathOp(Role.INIT, frames, 1)
    insert = (Frame("/bin/perf", 0x40, "maps__insert"), *frames[2:])
    used = [PathOp(Role.GET, insert, 1), PathOp(Role.PUT, insert, 1)]
    (culprit,) = verdict(init, [init, *used], Baseline.of([]))
    assert culprit.kind == MISSING_PUT
    assert culprit.function.function == "machine__process_mmap_event"


def test_handing_up_shown_only_by_the_leaked_object_itself_decides_nothing() -> None:
    """fontconfig's fc-query (no charset released): query_face makes a charset, hands
    one reference up to query_all through an out parameter and stores another in a
    pattern main destroys.  Which of the two main's put paired with is the counts'
    guess, so query_face and query_all were not shown to hand references up."""
    from refcntd.analysis.judging import PairedGroup, judge

    init = op(Role.INIT, "make_charset query_face query_all main")
    handed = op(Role.GET, "query_face query_all main")
    stored = op(Role.GET, "value_save pattern_add query_face query_all main")
    own_put = op(Role.PUT, "query_face query_all main")
    main_put = op(Role.PUT, "value_destroy pattern_destroy main")
    ops = [init, handed, stored, own_put, main_put]
    group = PairedGroup.of([(0x10, ops)], [])
    result = judge(group, {0x10: [(u, n) for u, n in group.objects[0][2]]})
    assert result.status == "unknown" and "own pairs" in result.reason
