"""What the call of the function that made an object says, and does not say
(issue 41): shapes of libxkbcommon's held-out wrong answers, on hand-written
paths (mutants-xkbcommon-heldout.md, in git at dc0f3e0, its three causes).

A failing public constructor must drop the object it made and return NULL;
refcntd sees no return value.  An object whose history never left its maker's
call, or released objects that died inside it, do not tell the maker's failure
path from its caller; and a constructor of another class that called the
probed get itself stored the reference there."""

from __future__ import annotations

from refcntd.analysis.attribution import Baseline, verdict
from refcntd.analysis.judging import PairedGroup, judge
from refcntd.analysis.pathops import MISSING_PUT, PathOp
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

START = "main __libc_start_call_main _start"


def op(kind: Role, names: str, t: int = 0) -> PathOp:
    frames = tuple(Frame("/usr/lib/libkb.so", 0x1000 + 0x10 * i, n)
                   for i, n in enumerate(f"{names} {START}".split()))
    return PathOp(kind, frames, 1, first_ns=t, last_ns=t)


def said(ops: list[PathOp], released: list[PathOp], type_name: str = ""
         ) -> tuple[str, str, list[str]]:
    objects = [(0x10, ops)]
    group = PairedGroup.of(objects, released, type_name) if type_name else \
        PairedGroup.of(objects, released)
    v = judge(group, {a: left for a, _, left in group.objects})
    return v.status, v.reason, [c.function.function for c in v.culprits]


def test_an_object_that_never_left_its_constructors_call_names_no_caller() -> None:
    """keymap.c:151: xkb_keymap_new_from_names failed to compile, lost the put of
    its failure path, returned NULL; print_keymap was named.  Nothing else of
    the object was seen, as when print_keymap keeps what it was returned."""
    init = op(Role.INIT, "keymap_new_from_names print_keymap")
    found = verdict(init, [init], Baseline.of([]))
    assert isinstance(found, str)
    assert "never left the call of keymap_new_from_names" in found
    assert "failure path" in found and "print_keymap, which kept it" in found


def test_an_object_used_outside_its_constructors_call_names_the_caller() -> None:
    """A state took and dropped a reference under the caller: the constructor
    returned the object, so the caller that kept it is named, as before."""
    ops = [op(Role.INIT, "keymap_new_from_names print_keymap", 1),
           op(Role.GET, "state_new use_state print_keymap", 2),
           op(Role.PUT, "state_unref use_state print_keymap", 3)]
    status, _, names = said(ops, [])
    assert status == "culprit" and names == ["print_keymap"]


def failed_compilations() -> list[PathOp]:
    """Released: keymaps whose compilation failed, dropped inside the constructor."""
    made = "keymap_new_from_buffer keymap_new_from_string test_compile_string"
    return [op(Role.INIT, made, 1), op(Role.PUT, made, 2)]


def test_released_objects_dropped_inside_their_maker_are_not_a_leak_left_it() -> None:
    """rulescomp.c:48: the keymap compiled, a state used it under the test, and the
    test's own unref was deleted; released keymaps at the same path were the
    failed compilations, put inside the constructor, which was named."""
    made = "keymap_new_from_buffer keymap_new_from_string test_compile_string"
    ops = [op(Role.INIT, made, 10), op(Role.GET, "state_new test_key_seq", 11),
           op(Role.PUT, "state_unref test_key_seq", 12)]
    status, reason, names = said(ops, failed_compilations())
    assert status == "unknown" and not names
    assert "dropped inside keymap_new_from_buffer's call" in reason
    assert "this one left it (an operation under state_new)" in reason


def test_released_objects_dropped_inside_their_maker_and_a_leak_that_did_not() -> None:
    """stringcomp.c:71: only the init of the leaked keymap was seen; the same as the
    constructor's failure path losing its put."""
    made = "keymap_new_from_buffer keymap_new_from_string test_compile_string"
    status, reason, names = said([op(Role.INIT, made, 10)], failed_compilations())
    assert status == "unknown" and not names
    assert "this one never left it either" in reason
    assert "keymap_new_from_string kept what keymap_new_from_buffer returned" in reason


def test_released_objects_put_by_their_callers_still_name_the_caller() -> None:
    """The rule it narrows: released objects left the constructor and were put by
    the function that got them, at this very path."""
    made = "keymap_new_from_buffer test_compile_string"
    released = [op(Role.INIT, made, 1), op(Role.PUT, "test_compile_string", 2)]
    status, _, names = said([op(Role.INIT, made, 10)], released)
    assert status == "culprit" and names == ["test_compile_string"]


def test_a_constructor_of_another_type_that_called_the_get_itself_stored_it() -> None:
    """keymap.c:102: xkb_keymap_unref lost the put of its context; xkb_keymap_new,
    which took the reference by calling xkb_context_ref itself (the first frame of
    the get's path), was named.  The leaked object's type, not that frame, says
    whose class the keeper works on."""
    ctx = [op(Role.INIT, "", 1), op(Role.GET, "xkb_keymap_new xkb_keymap_new_from_names", 2),
           op(Role.PUT, "", 3)]
    status, reason, names = said(ctx, [], "xkb_context")
    assert status == "unknown" and not names
    assert "xkb_keymap_new stored the reference in a xkb_keymap" in reason


def test_a_constructor_of_the_objects_own_type_is_still_named() -> None:
    """The same shape with a function of the object's own type: not stored in
    another object, so the rule stands aside (and, with no type known, the old
    reading of the first frame is kept)."""
    ctx = [op(Role.INIT, "", 1), op(Role.GET, "xkb_context_new_child xkb_setup", 2),
           op(Role.PUT, "", 3)]
    for type_name in ("xkb_context", ""):
        status, _, names = said(ctx, [], type_name)
        assert status == "culprit" and names == ["xkb_context_new_child"]
    assert said(ctx, [], "xkb_keymap")[0] == "unknown"


def test_a_named_getter_of_another_object_kept_by_its_caller_is_unchanged() -> None:
    """perf's shape the old rule was written for: the get wrapper is the first
    frame, the keeper above it (map__new keeps the dso): unknown either way."""
    ops = [op(Role.INIT, "", 1), op(Role.GET, "dso__get map__new machine__process", 2),
           op(Role.PUT, "", 3)]
    for type_name in ("dso", ""):
        status, reason, _ = said(ops, [], type_name)
        assert status == "unknown" and "map__new stored the reference in a map" in reason
    assert MISSING_PUT  # the kind the named answers above carry
