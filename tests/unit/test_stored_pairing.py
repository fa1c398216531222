"""Pairing a put with the get it releases when references are stored in owners
(issue 31): the kernel-dso shape of perf 6.1, from its recorded paths."""

from __future__ import annotations

from refcntd.analysis.apinames import api_class
from refcntd.analysis.pairing import pair
from refcntd.analysis.pathops import PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

OUTER = ("perf_session__process_events", "__cmd_report", "cmd_report", "main")
TEARDOWN = ("perf_session__delete", "cmd_report", "main")


def op(role: Role, *names: str, t: int = 0) -> PathOp:
    return PathOp(role, tuple(Frame("perf", 0x1000 + i, n) for i, n in enumerate(names)), 1,
                  first_ns=t, last_ns=t)


def kernel_dso() -> list[PathOp]:
    mmap = ("machine__process_kernel_mmap_event", *OUTER)
    return [
        op(Role.INIT, "dso__new", "__dsos__addnew", "dsos__findnew_id", *mmap, t=1),
        op(Role.GET, "dso__get", "__dsos__add", "__dsos__addnew", "dsos__findnew_id", *mmap,
           t=2),
        op(Role.PUT, "dso__put", "__dsos__addnew", "dsos__findnew_id", *mmap, t=3),
        op(Role.GET, "dso__get", "dsos__find_kernel_dso", *mmap, t=4),
        op(Role.GET, "dso__get", "map__new2", *mmap, t=5),
        op(Role.PUT, "dso__put", "map__delete", "map__put", "maps__exit", "machine__exit",
           *TEARDOWN, t=6),
        op(Role.PUT, "dso__put", "dsos__exit", "machine__exit", *TEARDOWN, t=7),
    ]


def test_api_class_follows_c_naming() -> None:
    assert api_class(("perf", "__dsos__add")) == "dsos"
    assert api_class(("perf", "map__new2.isra.0")) == "map"
    assert api_class(("libgstreamer", "gst_bin_add_func")) == "gst_bin"
    assert api_class(("perf", "main")) == ""


def test_an_alias_prefix_is_not_a_class() -> None:
    """fontconfig's hidden copies (IA__FcConfigReference, IA__FcConfigDestroy) share
    a prefix, not an object: upper case before `__` is skipped."""
    assert api_class(("libfontconfig", "IA__FcConfigDestroy.part.0")) == ""
    assert api_class(("x", "IA__map__new")) == "map"


def test_alias_prefixes_do_not_pair_an_initial_reference() -> None:
    """fontconfig batch 2, fcxml.c:1091: the parser's initial reference to a charset
    (made under IA__FcConfigReference) is the one left over when an expression
    stored another reference that its destructor (under IA__FcConfigDestroy) puts;
    read as a shared class "IA", the put balanced the initial reference and the
    expression's constructor was blamed."""
    load = ("_FcConfigParse", "IA__FcConfigReference", "FcConfigSubstitute", "main")
    ops = [op(Role.INIT, "FcParseCharSet", "FcEndElement", *load, t=1),
           op(Role.GET, "FcExprCreateCharSet", "FcPopExpr", "FcEndElement", *load, t=2),
           op(Role.PUT, "FcExprDestroy", "FcRuleDestroy", "IA__FcConfigDestroy", "FcFini",
              "main", t=3),
           # a temporary reference in a path without the prefix: "IA" is not on every path
           op(Role.GET, "FcValueSave", "FcConfigMatchValueList", "FcConfigSubstitute", "main",
              t=4),
           op(Role.PUT, "FcValueDestroy", "FcConfigMatchValueList", "FcConfigSubstitute", "main",
              t=5)]
    left, _ = pair(ops, set())
    assert [g.op for g, _ in left] == [Role.INIT]


def test_the_reference_handed_up_is_left_over() -> None:
    """Every get and put shares only cmd_report; the owner's API pairs them."""
    left, matches = pair(kernel_dso(), set())
    assert [(g.path[1][1], n) for g, n in left] == [("dsos__find_kernel_dso", 1)]
    paired = {g.path[1][1]: p.path[1][1] for g, p, _ in matches}
    assert paired["map__new2"] == "map__delete"
    assert paired["__dsos__add"] == "dsos__exit"


def test_a_lookup_is_not_an_owner() -> None:
    """thread__find_map hands its reference up: a put in thread__put (the thread's
    teardown) balances the map's creation reference, not the lookups'."""
    ops = [op(Role.INIT, "map__new", "machine__create_kernel_maps", "machine__init", "main",
              t=1),
           op(Role.GET, "map__get", "thread__find_map", "sample__resolve_kernel", "main", t=2),
           op(Role.PUT, "map__put", "thread__put", "machine__exit", "main", t=3)]
    left, _ = pair(ops, set())
    assert [g.op for g, _ in left] == [Role.GET]
