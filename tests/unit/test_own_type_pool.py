"""Released operations of a type are filtered by the functions that, in the leaked
objects, only touch another type, only when the pool is mixed (issue 41, right
answers alone): in a pool of one type, the function whose put was lost is
"foreign" exactly because its put is missing (libxkbcommon's tests: main put
keymaps; in the leaked objects main only touched the context)."""

from __future__ import annotations

from refcntd.analysis.model import LeakGroup
from refcntd.analysis.pathops import PathOp
from refcntd.analysis.verdicts import Evidence, _own_type, judge_process
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

NAMES = {}  # type: dict[str, int]


def op(kind: Role, names: str, t: int = 0) -> PathOp:
    frames = tuple(Frame("/usr/bin/t", NAMES.setdefault(n, 0x1000 + 0x10 * len(NAMES)), n)
                   for n in f"{names} _start".split())
    return PathOp(kind, frames, 1, first_ns=t, last_ns=t)


CALLERS = {"keymap": {op(Role.INIT, "keymap_new main").path[0]},
           "context": {op(Role.INIT, "main").path[0]}}


def test_a_pool_of_one_type_keeps_the_put_of_the_function_that_lost_it() -> None:
    pool = [op(Role.INIT, "keymap_new main", 1), op(Role.PUT, "main", 2)]
    assert _own_type(pool, "keymap", CALLERS) == pool


def test_a_mixed_pool_drops_what_only_another_types_functions_did() -> None:
    """An object made by a function that, in the leaked objects, only made another
    type shows the pool is mixed (runs saved before sites were keyed by name)."""
    other = [op(Role.INIT, "main", 3), op(Role.PUT, "main", 4)]
    pool = [op(Role.INIT, "keymap_new main", 1), *other]
    assert _own_type(pool, "keymap", CALLERS) == pool[:1]


def test_main_that_lost_its_put_is_named_from_released_objects() -> None:
    """state.c:737: main made a context and keymaps; the keymap's unref was deleted.
    In the leaked objects main only touched the context, yet released keymaps show
    main putting them: main is named."""
    kept = [op(Role.INIT, "keymap_new main", 10), op(Role.GET, "state_new use_state main", 11),
            op(Role.PUT, "state_unref use_state main", 12)]  # it left its constructor
    ctx = [op(Role.INIT, "main", 5)]
    groups = [LeakGroup("keymap", kept[0].frames), LeakGroup("context", ctx[0].frames)]
    evidence = {groups[0].key(): [Evidence(0x10, "keymap", 10, kept)],
                groups[1].key(): [Evidence(0x20, "context", 5, ctx)]}
    released = {groups[0].key(): [op(Role.INIT, "keymap_new main", 1), op(Role.PUT, "main", 2)]}
    judge_process(groups, evidence, released)
    assert groups[0].verdict.status == "culprit"
    assert [c.function.function for c in groups[0].culprits] == ["main"]
