"""Released objects made through the same inner calls by other callers name the
caller in the same role (issue 41, right answers alone): shapes of the tuning
sets' "initial reference never dropped elsewhere" unknowns, on hand-written
paths (mutants-right-s6.md, in git at dc0f3e0), and the shapes where the rule
must stand aside."""

from __future__ import annotations

from refcntd.analysis.analogs import inner_depth
from refcntd.analysis.judging import PairedGroup, judge
from refcntd.analysis.pathops import MISSING_PUT, PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

START = "main __libc_start_call_main _start"
ADDR = {}  # type: dict[str, int]


def op(kind: Role, names: str, t: int = 0) -> PathOp:
    """A path whose frames keep one address per function name (a function's frame
    is the same function wherever it appears)."""
    frames = tuple(Frame("/usr/lib/libkb.so", ADDR.setdefault(n, 0x1000 + 0x10 * len(ADDR)), n)
                   for n in f"{names} {START}".split())
    return PathOp(kind, frames, 1, first_ns=t, last_ns=t)


def said(ops: list[PathOp], released: list[PathOp]) -> tuple[str, str, list[str], str]:
    group = PairedGroup.of([(0x10, ops)], released)
    v = judge(group, {a: left for a, _, left in group.objects})
    kind = v.culprits[0].kind if v.culprits else ""
    return v.status, v.reason, [c.function.function for c in v.culprits], kind


HELPER = "keymap_new_from_names compile_rules"


def made_and_put(by: str, inner: str = HELPER, t: int = 1) -> list[PathOp]:
    """A released object made through `inner` called by `by`, which put it."""
    return [op(Role.INIT, f"{inner} {by}", t), op(Role.PUT, by, t + 1)]


def test_inner_depth_counts_the_shared_calls_from_the_refcount_side() -> None:
    a, b = op(Role.INIT, f"{HELPER} test_a"), op(Role.INIT, f"{HELPER} test_b")
    assert inner_depth(a.path, b.path) == 2
    assert inner_depth(a.path, op(Role.INIT, "test_a").path) == 0


def test_the_caller_in_the_role_where_other_callers_put_is_named() -> None:
    """keymap.c:148: test_keymap's keymap, made through the helper every test
    calls, never put; test_garbage_key's, made the same way, was put by it."""
    leaked = [op(Role.INIT, f"{HELPER} test_a", 10)]
    status, reason, names, kind = said(leaked, made_and_put("test_b") + made_and_put("test_c", t=3))
    assert status == "culprit" and names == ["test_a"] and kind == MISSING_PUT
    assert "made through the same calls (keymap_new_from_names < compile_rules)" in reason
    assert "put by the caller compile_rules returned them to (2 reference(s))" in reason


def test_analogs_that_disagree_about_the_put_name_nobody() -> None:
    """One other caller put its object, another's was put by a cleanup it was
    stored for: the role does not say who puts."""
    stored = [op(Role.INIT, f"{HELPER} test_c", 3), op(Role.PUT, "cleanup main_loop", 4)]
    status, _, names, _ = said([op(Role.INIT, f"{HELPER} test_a", 10)],
                               made_and_put("test_b") + stored)
    assert status == "unknown" and not names


def test_only_the_constructor_shared_and_never_left_it_is_its_failure_path() -> None:
    """table.c:150: a constructor's failure path lost its put; released tables
    made by it were put by their callers; the failed one never left it."""
    status, _, names, _ = said([op(Role.INIT, "table_new_from_buffer test_a", 10)],
                               made_and_put("test_b", "table_new_from_buffer"))
    assert status == "unknown" and not names


def test_only_the_constructor_shared_but_the_object_left_it() -> None:
    """The same, but a state took and dropped a reference under the caller: the
    constructor returned it, and the caller in the role is named."""
    leaked = [op(Role.INIT, "table_new_from_buffer test_a", 10),
              op(Role.GET, "state_new use_state test_a", 11),
              op(Role.PUT, "state_unref use_state test_a", 12)]
    status, _, names, _ = said(leaked, made_and_put("test_b", "table_new_from_buffer"))
    assert status == "culprit" and names == ["test_a"]


def test_failed_constructions_are_set_aside_when_the_object_left_its_maker() -> None:
    """test/compose.c:428: a released table died inside its constructor (a failure
    path), the others were put by their callers; the leaked one was used under
    its caller, so the failed one says nothing about it."""
    failed = [op(Role.INIT, "table_new_from_locale test_b", 5),
              op(Role.PUT, "table_new_from_locale test_b", 6)]
    leaked = [op(Role.INIT, "table_new_from_locale test_a", 10),
              op(Role.GET, "state_new use_state test_a", 11),
              op(Role.PUT, "state_unref use_state test_a", 12)]
    released = made_and_put("test_b", "table_new_from_locale") + failed
    assert said(leaked, released)[2] == ["test_a"]
    # never left: the failed constructions show the failure story is possible
    assert said(leaked[:1], released)[0] == "unknown"


def test_every_maker_putting_its_own_names_the_leaked_ones_maker() -> None:
    """state.c:245: states made by several test functions, each put by the test
    that made it; test_update_key's was not."""
    released = made_and_put("test_b", "") + made_and_put("test_c", "", 3)
    status, reason, names, _ = said([op(Role.INIT, "test_a", 10)], released)
    assert status == "culprit" and names == ["test_a"]
    assert "every released object of the kind was put by the function that made it" in reason


def test_one_maker_putting_its_own_is_that_functions_habit() -> None:
    """test-name-parse.c:19: every released pattern was made and put by main; the
    leaked one was made by a parser and returned to a test function: the parser
    is not named for main's habit."""
    status, _, names, _ = said([op(Role.INIT, "name_parse test")],
                               made_and_put("", "") + made_and_put("", "", 3))
    assert status == "unknown" and not names
