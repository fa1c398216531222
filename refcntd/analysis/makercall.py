"""What an object's history says about the call of the function that made it.

A public constructor that fails must drop the object it made and return NULL;
one that succeeds returns it.  refcntd sees neither return value, only where
the object's operations were made: an object none of whose operations lies
outside its maker's call looks the same whether the maker's failure path lost
its put or the caller kept what it was given, and released objects that died
inside their maker's call (failed constructions) say nothing about who puts
an object that left it.  Also what the leaked object's type says about a
function's name: a constructor of another class that took a reference stored
it there.  libxkbcommon held out (benchmarks/results/
mutants-xkbcommon-heldout.md, in git at dc0f3e0): 9 of its 12 wrong answers were failure paths,
the other 3 the type.
"""

from __future__ import annotations

from collections.abc import Collection

from refcntd.analysis.apinames import CAMEL, api_class, named_constructor
from refcntd.analysis.pathops import START_FUNCTIONS, FuncKey, PathOp, frame_name
from refcntd.kernel.abi import Role


def _name(op: PathOp, k: int) -> str:
    return frame_name(op.frames[k])


def _inside(op: PathOp, call: tuple[FuncKey, ...]) -> bool:
    """Whether an operation was made under this call chain (the call's function
    first, its callers after), at its depth or deeper."""
    return len(op.path) >= len(call) and op.path[len(op.path) - len(call):] == call


def outside(ops: list[PathOp], call: tuple[FuncKey, ...]) -> PathOp | None:
    """The object's first operation made outside the call, if any."""
    return next((op for op in ops if not _inside(op, call)), None)


def never_left(get: PathOp, ops: list[PathOp], i: int) -> str:
    """Why the caller (frame i) of the functions that made the object is not named
    when no released object got a reference at this path and none of the object's
    operations lies outside the outermost maker's call (frame i - 1): its failure
    path dropping nothing and its caller keeping what it returned leave the same
    history (libxkbcommon's xkb_keymap_new_from_names).  "" otherwise."""
    if get.op != Role.INIT or i == 0 or outside(ops, get.path[i - 1:]) is not None:
        return ""
    maker, caller = _name(get, i - 1), _name(get, i)
    return (f"the object never left the call of {maker} that made it (none of its "
            f"operations is outside it): {maker} may have failed and had to drop it "
            f"(a put missing on its failure path), or returned it to {caller}, which "
            "kept it; no released object of its kind got a reference at this path")


def died_in_maker(get: PathOp, ops: list[PathOp], put: PathOp, k: int,
                  sources: Collection[FuncKey]) -> str:
    """Why the released objects' put under the maker (frame k of an init's path, a
    function that makes objects or hands them up) is not read as this object's
    missing put: those objects never left the maker's call (it dropped them, a
    failure path).  An object that left it was returned, and they do not say who
    should put it; one that did not looks the same as a caller keeping what the
    maker returned.  "" when the put is not of that kind."""
    call = get.path[k:]
    makers = get.path[:k + 1]
    if get.op != Role.INIT or k + 1 >= len(get.path) or not _inside(put, call) \
            or get.path[k][1] in START_FUNCTIONS \
            or not all(named_constructor(f) or f in sources for f in makers):
        return ""
    maker, caller = _name(get, k), _name(get, k + 1)
    left = outside(ops, call)
    if left is None:
        return (f"released objects made here were dropped inside {maker}'s call (they "
                f"never left it: a failure path), and this one never left it either: "
                f"{maker}'s failure path may have lost its put, or {caller} kept what "
                f"{maker} returned")
    return (f"released objects made here were dropped inside {maker}'s call (they never "
            f"left it: a failure path); this one left it (an operation under "
            f"{_name(left, 0)}), so they do not show who should have put it")


def makes_own_type(func: FuncKey, type_name: str) -> bool:
    """Whether a function's name says it works on the leaked object's own type
    (`xkb_keymap_new_from_names` and type xkb_keymap, `dso__get` and dso,
    `gst_mini_object_ref` and GstMiniObject): a storer of that class keeps the
    reference for an object of its own kind, not in another one."""
    snake = CAMEL.sub(r"\1_\2", type_name.removeprefix("struct ").strip()).lower()
    name = func[1].split(".")[0].lstrip("_").lower()
    return bool(snake) and (name.startswith(f"{snake}_") or api_class(func) == snake)
