"""A culprit found against a good run of the same workload (--baseline OLD.json).

One run shows where every reference was got, not where a put went missing:
a deleted put leaves no trace on the object it leaks, and the released
objects that would show where it belonged went through the same code
(benchmarks/mutants: most real-code verdicts of a single run are "unknown").
A run of the same workload on the code before the change does show it.
Both runs count every type's operations per path (ProcessReport.operations);
compared per function that made the call, the put a regression lost is
counted there and not here, and the get it added here and not there.

Every object's gets minus its puts is the references it still holds, so the
changes of all functions add up to the references this run kept more than
the good one.  A function is named when it kept at least DOMINANT times more
than the next one and than all others together (what two runs of the same
work move cancels out), not counting puts lost in a put's teardown (a
destructor, a container's own reference): those are what a put that never
became the last one no longer runs, a consequence.  A type whose only change
is such a teardown takes the culprit of the leaked type whose teardown it
is, else of the types changed outside any; with none, the teardown itself is
named (a destructor that forgot a put).  With several good runs, a function
changed only if it did against each of them, the same way (what differs
between good runs is noise).  Two runs of a real workload are two executions
(threads, caches): what is not decided is said, with the functions, and a
single run's guess is not kept over it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from refcntd.analysis.apinames import api_class, name_words
from refcntd.analysis.pathops import (
    EXTRA_GET,
    MISSING_PUT,
    Culprit,
    FuncKey,
    PathOp,
    func_key,
    is_get,
)
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


@dataclass
class Change:
    """One function's operations on a type: this run's counts minus the good run's."""

    function: str
    # made while another reference was being put (a destructor's puts, a container's
    # own reference dropped by the last put): a consequence of a leak, seldom its cause
    nested: bool = False
    gets: int = 0  # init and get
    puts: int = 0
    # the call's path up to this function in the run that has it more (the good run's
    # for lost puts, this run's for added gets), and how many it differs by
    path: tuple[Frame, ...] = ()
    path_change: int = 0

    @property
    def kept(self) -> int:
        """References this function kept more than in the good run."""
        return self.gets - self.puts

    @property
    def one_sided(self) -> bool:
        """Only puts lost, or only gets added: what a forgotten put or an extra get
        does.  A function whose gets and puts both moved did other work."""
        return (self.gets == 0 and self.puts < 0) or (self.puts == 0 and self.gets > 0)


# the last word of an API function's name: what it does to the reference
API_VERBS = {Role.INIT: frozenset({"new", "init", "create", "alloc"}),
             Role.GET: frozenset({"get", "zget", "ref"}),
             Role.PUT: frozenset({"put", "zput", "unref", "release"})}


def call_site(op: PathOp) -> int:
    """Index of the function that made the call: past the API's own functions, whose
    name ends in what they do (perf's dso__put around its __refcnt__put stub,
    gst_object_unref around the probed g_object_unref, inlined or not).  Another
    type's put further out (a thread's maps put as thread__put tears it down) made
    the call."""
    verbs = API_VERBS.get(op.op, frozenset())
    i = 0
    while i + 1 < len(op.path) and _last_word(op.path[i]) in verbs and \
            (i == 0 or api_class(op.path[i]) == api_class(op.path[0])):
        i += 1
    return i


# what a function run by a put is named for: the put itself, or the destruction
TEARDOWN_WORDS = API_VERBS[Role.PUT] | {"delete", "free", "destroy", "finalize", "dispose",
                                        "exit"}  # perf's map__exit: the delete's body


def _nested(op: PathOp, site: int) -> bool:
    return any(_last_word(f) in TEARDOWN_WORDS for f in op.path[site:])


def _last_word(func: FuncKey) -> str:
    return name_words(func)[-1].rstrip("0123456789")  # map__new2


def _name(func: FuncKey) -> str:
    """A function as both runs know it: by name, without gcc's clone suffix (a
    rebuilt program may sit at another path, and foo.isra.0 become foo.part.0)."""
    return func[1].split(".")[0]


# (function, nested, get or put, it and its caller, the call's line): a line that
# moved between the builds is two calls of one function, summed as its change
CallKey = tuple[str, bool, Role, tuple[str, ...], int]


def _per_call(ops: list[PathOp], sign: int) -> dict[CallKey, tuple[int, tuple[Frame, ...]]]:
    """Each call's count (times `sign`) and its path up to the function that made it."""
    out: dict[CallKey, tuple[int, tuple[Frame, ...]]] = {}
    for op in ops:
        if not op.path or not (is_get(op.op) or op.op == Role.PUT):
            continue
        s = call_site(op)
        key = (_name(op.path[s]), _nested(op, s), Role.GET if is_get(op.op) else Role.PUT,
               tuple(map(_name, op.path[:s + 2])), op.frames[s].line)
        count, first = out.get(key, (0, op.frames[:s + 1]))
        out[key] = (count + sign * op.count, first)
    return out


def changes(before: list[PathOp], after: list[PathOp]) -> list[Change]:
    """Every function whose calls on the type changed, in a stable order."""
    calls = _per_call(before, -1)
    for key, (count, path) in _per_call(after, 1).items():
        calls[key] = (calls.get(key, (0, path))[0] + count, path)
    out: dict[tuple[str, bool], Change] = {}
    for (func, nested, role, *_), (count, path) in sorted(calls.items(),
                                                           key=lambda kv: kv[0]):
        if count == 0:
            continue
        c = out.setdefault((func, nested), Change(func, nested))
        if role == Role.GET:
            c.gets += count
        else:
            c.puts += count
        # the call that says most: a put lost (good run's path), a get added (this one's)
        telling = -count if role == Role.PUT else count
        if telling > c.path_change:
            c.path, c.path_change = path, telling
    return sorted(out.values(), key=lambda c: (-c.kept, c.function, c.nested))


def changes_against(befores: Sequence[list[PathOp]], after: list[PathOp]) -> list[Change]:
    """changes() against several good runs: a function changed only if it did against
    every one, the same way; its change is the smallest (what differs between good
    runs of the same work is noise, not the regression)."""
    per_run = [{(c.function, c.nested): c for c in changes(before, after)} for before in befores]
    out = []
    for key in sorted(set().union(*per_run)) if per_run else ():
        found = [run.get(key) for run in per_run]
        if any(c is None for c in found):
            continue
        seen = [c for c in found if c is not None]
        if len({(c.kept > 0, c.kept < 0) for c in seen}) == 1:
            out.append(min(seen, key=lambda c: (abs(c.kept), abs(c.gets) + abs(c.puts))))
    return sorted(out, key=lambda c: (-c.kept, c.function, c.nested))


@dataclass(frozen=True)
class Regression:
    """What the comparison says for one type: a culprit, or why none."""

    type_name: str
    kept: int  # references this run kept more than the good run, all functions together
    culprit: Culprit | None
    reason: str
    teardown: bool = False  # the culprit's lost puts were all made in a put's teardown


# how many times more references the named function must have kept than the next
# one, and than all the others together (outside teardowns): two runs of the same
# work differ by a few (a GStreamer sink's extra latency query, made and put)
DOMINANT = 4


def regression(type_name: str, befores: Sequence[list[PathOp]], after: list[PathOp],
               baseline: str) -> Regression:
    """The function whose calls on the type changed by every reference this run kept
    more, when it alone did (see the module doc)."""
    found = changes_against(befores, after)
    kept = sum(c.kept for c in found)
    if kept <= 0:
        return Regression(type_name, kept, None,
                          f"no more {type_name} references kept than in {baseline}")
    keeping = [c for c in found if c.kept > 0]
    primary = [c for c in keeping if not c.nested] or keeping
    # the others' changes: the next largest alone, and all together (what two runs of
    # the same work move cancels out: one run's extra query is put there too)
    outside = sum(c.kept for c in found if c.nested == primary[0].nested)
    others = max([abs(outside - primary[0].kept), *(c.kept for c in primary[1:2])])
    if others * DOMINANT > primary[0].kept:
        names = ", ".join(f"{c.function} {c.kept:+d}" for c in primary[:4])
        more = f" and {len(primary) - 4} more" if len(primary) > 4 else ""
        return Regression(type_name, kept, None,
                          f"against {baseline}, {_times(kept, 'more reference')} of "
                          f"{type_name} are kept, by {len(primary)} functions ({names}{more})"
                          ": the change is in one of them, or the two runs did different "
                          "work; a run whose work is the same on both builds would decide")
    top = primary[0]
    if not top.path or not top.path[-1].function:
        return Regression(type_name, kept, None,
                          f"against {baseline}, the {type_name} references kept more were "
                          "got or put in code without a symbol "
                          f"({top.path[-1].describe() if top.path else '?'}): which function "
                          "is not known")
    kind = MISSING_PUT if top.puts < 0 else EXTRA_GET
    frame = top.path[-1]
    what = f"{_times(-top.puts, 'put')} fewer" if kind == MISSING_PUT else \
        f"{_times(top.gets, 'get')} more"
    if not top.one_sided:
        what += f" (gets {top.gets:+d}, puts {top.puts:+d})"
    at = f" at {frame.file.rsplit('/', 1)[-1]}:{frame.line}" if frame.file else ""
    rest = [c for c in keeping if c is not top]
    if not rest:
        context = f"all {_times(kept, 'reference')} this run kept more"
    else:
        context = (f"{top.kept} of the {kept} references this run kept more; the rest "
                   f"changed with it or with the runs' different work "
                   f"({', '.join(_moved(c) for c in rest[:3])}"
                   f"{', ...' if len(rest) > 3 else ''})")
    why = f"{top.function} made {what}{at} than in {baseline}: {context}"
    culprit = Culprit(kind, frame, top.path, references=top.kept, why=why,
                      rule="good-runs" if top.one_sided else "good-runs-both")
    return Regression(type_name, kept, culprit, why, top.nested)


def consequence(reg: Regression, found: dict[str, Regression]) -> Regression:
    """A type whose only change is puts lost in a teardown is a consequence when
    that teardown is another leaked type's (a leaked dso no longer runs
    dso__delete, which put its nsinfo: the dso's culprit is the nsinfo's), else
    beside types changed outside any teardown (a leaked thread's maps no longer
    put): their culprit is its culprit.  With causes of several functions, which
    one is not decided; with none, the teardown itself is named (a destructor
    that forgot a put)."""
    if reg.culprit is None or not reg.teardown:
        return reg
    owner = _owner_type(reg.culprit.frames, found, reg.type_name)
    if owner is not None:
        return _caused_by(reg, {owner: consequence(found[owner], {
            t: r for t, r in found.items() if t != reg.type_name})})
    return _caused_by(reg, {t: r for t, r in found.items() if t != reg.type_name
                            and r.culprit is not None and not r.teardown})


def _owner_type(frames: tuple[Frame, ...], found: dict[str, Regression], own: str
                ) -> str | None:
    """The leaked type whose teardown the lost puts were made in (dso__delete: dso)."""
    by_class = {t.lower(): t for t, r in found.items() if r.kept > 0 and t != own}
    return next((by_class[api_class(func_key(f)).lower()] for f in frames
                 if api_class(func_key(f)).lower() in by_class), None)


def _caused_by(reg: Regression, causes: dict[str, Regression]) -> Regression:
    assert reg.culprit is not None
    if not causes:
        return reg
    funcs = sorted({c.culprit.function.function for c in causes.values() if c.culprit})
    types = ", ".join(sorted(causes))
    where = reg.culprit.function.function
    if len(funcs) != 1:
        which = f"their changes are in {', '.join(funcs)}: which one is not decided" \
            if funcs else "their own culprit is not decided"
        return Regression(reg.type_name, reg.kept, None,
                          f"the {reg.type_name} puts lost are in a teardown ({where}) that "
                          f"leaked objects of {types} no longer run; {which}", True)
    cause = next(c for c in causes.values() if c.culprit)
    assert cause.culprit is not None
    why = (f"the {reg.type_name} puts lost are in a teardown ({where}) that leaked "
           f"{cause.type_name} objects no longer run: {cause.culprit.why}")
    return Regression(reg.type_name, reg.kept,
                      dataclasses.replace(cause.culprit, why=why, rule="good-runs-teardown"),
                      why, True)


def _moved(c: Change) -> str:
    how = "in a put's teardown, " if c.nested else ""
    return f"{c.function}: {how}gets {c.gets:+d}, puts {c.puts:+d}"


def _times(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
