"""A run alone says "unknown" where the evidence is pooled or absent (issue 41):
shapes of fontconfig's batch-3 mutants, on hand-written paths.

Released objects' operations are kept per path, not per object, so their pairs
are a pool's; and a release function that lost its put leaves no operation at
all.  Both made refcntd name a function with confidence that was not the one
whose put was missing (mutants-alone.md, in git at dc0f3e0)."""

from __future__ import annotations

from refcntd.analysis.judging import PairedGroup, judge
from refcntd.analysis.pathops import PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

START = "__libc_start_call_main _start"


def op(kind: Role, names: str, t: int, count: int = 1) -> PathOp:
    frames = tuple(Frame("/usr/bin/fc-cat", 0x1000 + 0x10 * i, n)
                   for i, n in enumerate(f"{names} {START}".split()))
    return PathOp(kind, frames, count, first_ns=t, last_ns=t)


def said(objects: list[list[PathOp]], released: list[PathOp]) -> tuple[str, list[str]]:
    group = PairedGroup.of([(0x10 * (k + 1), ops) for k, ops in enumerate(objects)],
                           released)
    v = judge(group, {a: left for a, _, left in group.objects})
    return v.reason, [c.function.function for c in v.culprits]


def parse_dir() -> tuple[list[PathOp], list[PathOp]]:
    """Released: the configuration's set only.  Leaked: a set FcParseDir made (under
    FcGetPaths), listed (its get) and destroyed, whose list's reference stayed."""
    released = [op(Role.INIT, "FcConfigCreate FcInitLoadConfig main", 1),
                op(Role.PUT, "FcConfigDestroy FcFini main", 2)]
    parse = "FcEndElement FcConfigParse main"
    return released, [op(Role.INIT, f"FcGetPaths FcParseDir {parse}", 10),
                      op(Role.GET, f"FcParseDir {parse}", 11),
                      op(Role.PUT, f"FcParseDir {parse}", 12)]


def test_a_holder_that_puts_its_own_references_is_not_read_as_handing_over() -> None:
    """fc-cat.c:393: main makes the arguments set and destroys it (its list keeps it
    until main's FcStrListDone), FcFini puts the configuration's sets; pooled, the
    set made in main pairs with FcFini's put, and the cache's set main no longer
    destroys (listed by cache_print_set, which puts only its own list's
    reference) was blamed on cache_print_set."""
    released = [op(Role.INIT, "FcConfigCreate FcInitLoadConfig main", 1),
                op(Role.INIT, "main", 2),
                op(Role.PUT, "main", 4),
                op(Role.PUT, "FcConfigDestroy FcFini main", 5)]
    leaked = [op(Role.INIT, "main", 10), op(Role.GET, "cache_print_set main", 11),
              op(Role.PUT, "FcStrListDone cache_print_set main", 12)]
    reason, culprits = said([leaked], released)
    assert culprits == []
    assert "main put 1 itself" in reason


def test_gets_that_never_met_a_put_are_unknown() -> None:
    """fcstr.c:1640: FcStrListDone lost its put, so every list's reference leaks and
    no operation shows where; FcParseDir, which gets a list and destroys its set,
    was named as taking an extra get."""
    released, leaked = parse_dir()
    reason, culprits = said([leaked], released)
    assert culprits == []
    assert "no get of the object's kind ever met a put" in reason


def test_a_get_that_met_a_put_elsewhere_still_names_the_keeper() -> None:
    """The same shape where another leaked object's list was done: gets do meet puts,
    and FcParseDir's extra get is named as before."""
    released, leaked = parse_dir()
    other = [op(Role.INIT, "main", 20), op(Role.GET, "cache_print_set main", 21),
             op(Role.PUT, "FcStrListDone cache_print_set main", 22)]
    _, culprits = said([leaked, other], released)
    assert "FcParseDir" in culprits
