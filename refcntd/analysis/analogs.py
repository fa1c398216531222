"""Released objects made through the same inner calls as a leaked one, by
other callers: where their caller put them, this object's caller should have.

An initial reference made at a path no released object shares exactly (a test
function's own keymap, made through a helper every test calls) is otherwise
unknown: released objects "dropped theirs elsewhere".  But when released
objects were made through the very same inner calls (the constructor and the
helpers up to where their path leaves this one's) and each was put by its
function at that point, the calls below it hand the object up, and this
path's function at that point kept it: the same role, the same missing put.
With no inner call shared, the role is "the function that made it": named
only when every released object was put by its own maker and at least two
makers (start functions aside) show it, not one function's habit.

Stands aside (unknown, as before) when those released objects disagree about
who put them; when the function in the role is unnamed or named as a
constructor; when the shared part is only constructors and the object never
left their call (their failure path lost its put and returned NULL, which
leaves the same history); and when some released objects died inside the
shared calls (failed constructions) and this one never left them.  Failed
constructions are no evidence about an object that left the call.
mutants-right-s6.md (git show dc0f3e0:benchmarks/results/...): the tuning shapes and their counts.
"""

from __future__ import annotations

from refcntd.analysis import pathops
from refcntd.analysis.apinames import named_constructor
from refcntd.analysis.makercall import outside
from refcntd.analysis.pairing import put_owner
from refcntd.analysis.pathops import Culprit, FuncKey, PathOp, frame_name
from refcntd.kernel.abi import Role

Expected = dict[tuple[bool, tuple[FuncKey, ...]], list[tuple[PathOp, int]]]
# none shared: the released objects' makers that must each have put their own (besides
# start functions, which make and put everything they use)
LOCAL_MAKERS = 2
Analog = tuple[tuple[FuncKey, ...], PathOp, int]  # released init's path, its put, references


def inner_depth(a: tuple[FuncKey, ...], b: tuple[FuncKey, ...]) -> int:
    """Length of the common inner part (refcount call side) of two paths."""
    depth = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        depth += 1
    return depth


def analogs(get: PathOp, expected: Expected) -> tuple[int, list[Analog]]:
    """The released inits sharing the longest inner part with this one's path and
    diverging right after it (none shared: every released init), with the puts
    they were paired with."""
    best, found = 0, []  # type: int, list[Analog]
    for (is_init, path), puts in expected.items():
        depth = inner_depth(path, get.path)
        if not is_init or depth >= min(len(path), len(get.path)) or depth < best:
            continue
        if depth > best:
            best, found = depth, []
        found += [(path, put, n) for put, n in puts]
    return best, found


def same_role(get: PathOp, ops: list[PathOp], expected: Expected,
              callers: set[FuncKey]) -> list[Culprit]:
    """The function of this init's path in the role where every analog's caller put
    its object (see the module's docstring); [] when the evidence does not say."""
    if get.op != Role.INIT or len(get.path) < 2:
        return []
    p, found = analogs(get, expected)
    shared = get.path[:p]
    # released objects dropped inside the shared calls were failed constructions
    failed = [a for a in found if put_owner(a[1], callers) in shared]
    left = outside(ops, get.path[p - 1:]) is not None if p else True
    found = [a for a in found if a not in failed]
    makers = {path[0] for path, _, _ in found if path[0][1] not in pathops.START_FUNCTIONS}
    if not p and len(makers) < LOCAL_MAKERS:
        return []  # one function's habit (main making and putting) is not the kind's
    if not found or (failed and not left) or any(
            put_owner(put, callers) != path[p] for path, put, _ in found):
        return []
    keeper = get.frames[p]
    if not keeper.function or named_constructor(get.path[p]) or (
            not left and all(named_constructor(f) for f in shared)):
        return []  # only the maker shared, and the object never left it: its failure path?
    return [_culprit(get, p, found)]


def _culprit(get: PathOp, p: int, found: list[Analog]) -> Culprit:
    keeper, n = frame_name(get.frames[p]), sum(k for _, _, k in found)
    if p:
        role = (f"released objects made through the same calls "
                f"({' < '.join(frame_name(f) for f in get.frames[:p])}) by other callers were "
                f"put by the caller {frame_name(get.frames[p - 1])} returned them to")
    else:
        role = "every released object of the kind was put by the function that made it"
    return Culprit(pathops.MISSING_PUT, get.frames[p], get.frames[:p + 1],
                   expected=found[0][1].frames, rule="analog",
                   why=f"{role} ({n} reference(s)); here that is {keeper}, which never put it")
