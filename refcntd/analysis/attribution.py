"""Which get has no put: name the likely culprit of each leak group.

Each operation is known by its *path*: the functions from the refcount
call outward (the stub itself dropped).  Within one leaked object every put
is matched with the get whose path shares the deepest common caller with
the put's path; ties go to the object's initial reference, then to gets
made through a reference source, so that in

    funcA() { get(obj); return obj; }      funcC() { o = funcA(); get(o); put(o); }

funcC's put balances the reference funcA handed it and funcC's own get is
the extra one.  A *reference source* is a function whose gets outnumber its
puts in objects that were released correctly (a getter or constructor that
hands references to its callers).  The culprit of an unmatched get is the
first function on its path, outward, that is not a reference source: it got
(or received) the reference and kept it.  A put belongs to the first
function on its path that is not a *reference sink* (a put wrapper such as
`release()`, whose puts outnumber its gets in released objects).  The
culprit is a *missing put* when no put of the object belongs to it, an
*extra get* when one does: it puts the object, but got it once more.
When no object of the type was released, matched pairs inside the leaked
objects serve as the evidence instead: every function on a matched get's
path below the function where it met its put handed that reference up
(counted: a function whose references were left over more often than they
were handed up keeps them).

What the evidence does not decide is said, not guessed (on real code the
guesses were mostly wrong, benchmarks/mutants): when another get of the
object pairs the rest off as well and leads to another function
(equal_leftovers); when the keeper got the reference through a callee no
released object shows handing references up (it may have stored it, or had
one too many); when the keeper is a constructor or inserter of another
object (the put is missing where that object goes, which this one's history
does not show); when released objects had such a reference put below
the keeper but nothing in this object's history shows where it went, or the
keeper itself put as many as were got there (released paths are pooled, not
kept per object); and when no get of the kind ever met a put (a release
function that lost its put leaves no operation to see).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refcntd.analysis.analogs import same_role
from refcntd.analysis.apinames import api_class, name_words, named_constructor, named_getter
from refcntd.analysis.makercall import died_in_maker, makes_own_type, never_left
from refcntd.analysis.pairing import (
    Pairs,
    common_depth,
    handed_up,
    in_time,
    put_callers,
    put_owner,
    put_wrappers,
    reference_sinks,
    reference_sources,
)
from refcntd.analysis.pathops import (
    EXTRA_GET,
    MISSING_PUT,
    START_FUNCTIONS,
    Culprit,
    FuncKey,
    PathOp,
    frame_name,
    func_key,
    is_get,
)
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def culprit_of(get: PathOp, ops: list[PathOp], sources: set[FuncKey], sinks: set[FuncKey]
               ) -> Culprit | None:
    """The first non-source function on the get's path, and whether it owns a put
    (the rule without a baseline; see verdict() for the full one)."""
    found = verdict(get, ops, Baseline.of([], sources, sinks))
    return found[0] if isinstance(found, list) else None


# ---- the verdict: one culprit, a tie, or unknown with the reason -------------------
UNKNOWN = "unknown"
TIE = "tie"
FOUND = "culprit"


@dataclass
class Baseline:
    """What objects of the type that were released correctly did: the evidence
    a leaked object is compared with."""

    released: list[PathOp]
    sources: set[FuncKey]
    sinks: set[FuncKey]
    wrappers: set[FuncKey]  # sinks that never see a get: release()-style put wrappers
    # (initial reference or not, get path) -> the puts released pairs matched with it
    expected: dict[tuple[bool, tuple[FuncKey, ...]], list[tuple[PathOp, int]]]
    suffixes: set[tuple[FuncKey, ...]]  # every outer part of a released path
    callers: set[FuncKey] = field(default_factory=set)  # put_callers(): who owns a put
    # functions that released pairs show handing a reference up to their caller (not
    # storing it in an owner, which `sources`' balance cannot tell apart)
    handed: set[FuncKey] = field(default_factory=set)
    get_sites: set[tuple[str, int]] = field(default_factory=set)  # (module, vaddr) on gets
    # sources only the leaked objects' own pairs show (PairedGroup.of)
    by_leaks: set[FuncKey] = field(default_factory=set)
    # whether any get (not an initial reference) met a put, in released objects or in
    # the leaked objects' own pairs (PairedGroup.of)
    gets_put: bool = True
    type_name: str = ""  # the leaked objects' type, when known (PairedGroup.of)

    @classmethod
    def of(cls, released: list[PathOp], sources: set[FuncKey] | None = None,
           sinks: set[FuncKey] | None = None) -> Baseline:
        src = reference_sources(released) if sources is None else sources
        snk = reference_sinks(released) if sinks is None else sinks
        expected: dict[tuple[bool, tuple[FuncKey, ...]], list[tuple[PathOp, int]]] = {}
        wrappers = put_wrappers(released)
        pairs = Pairs(released, src, wrappers, one_object=False)
        matches = pairs.pair()[1]
        for get, put, n in matches:
            expected.setdefault(_expected_key(get), []).append((put, n))
        suffixes = {op.path[k:] for op in released for k in range(len(op.path))}
        return cls(released, src, snk, wrappers, expected, suffixes,
                   put_callers(released), set(handed_up(matches, pairs.everywhere)),
                   {(f.module, f.vaddr) for op in released if is_get(op.op)
                    for f in op.frames})


def _expected_key(get: PathOp) -> tuple[bool, tuple[FuncKey, ...]]:
    """Released pairs speak for a get made at the same path in the same way: an
    initial reference made there (a constructor's call) and a reference taken on an
    existing object there are different references, whose puts are elsewhere
    (fontconfig's FcParseInclude makes a rule set that FcConfigCleanup puts and
    takes a reference on the set it flushes, which FcConfigDestroy puts)."""
    return get.op == Role.INIT, get.path


STORER_WORDS = frozenset({"new", "init", "add", "insert", "create", "append", "prepend",
                          "push", "set", "attach", "store"})


def _stores_for_another(get: PathOp, i: int, type_name: str) -> str:
    """Why a constructor or inserter of another object that kept the reference is
    not named: it stored the reference in that object, so the put is missing where
    that object is destroyed or the reference removed, which no path of this
    object shows (perf's map__new keeps the dso that map__exit should put).  The
    object's own class is read from the first frame below the keeper (perf's
    dso__get wrapper); when the keeper called the probed function itself, that
    frame is the keeper's, and the type says it (libxkbcommon's xkb_keymap_new
    keeps the context that xkb_keymap_unref should put)."""
    func = get.path[i]
    words = {w.rstrip("0123456789") for w in name_words(func)}  # map__new2
    cls = api_class(func)
    if not cls or not STORER_WORDS & words:
        return ""
    if makes_own_type(func, type_name) if i == 0 and type_name \
            else cls == api_class(get.path[0]):
        return ""
    return (f"{frame_name(get.frames[i])} stored the reference in a {cls} it builds or fills "
            f"(no released object got a reference at this path): the put is likely "
            f"missing where that {cls} is destroyed or the reference removed, which "
            "this object's history does not show")


def reference_holder(get: PathOp, sources: set[FuncKey], ctor_rule: bool,
                     sinks: frozenset[FuncKey] | set[FuncKey] = frozenset()) -> int | None:
    """Index of the first function on the get's path that keeps the reference.

    ctor_rule (no released object to learn from): the functions that made the
    object, named as constructors (named_constructor: map__init inlined into
    map__new2, g_object_new), are taken to return it, when they have a caller.
    A function named as a getter (named_getter) hands references up unless
    released objects show it putting more than it gets (sinks); the outermost
    function of a path is never skipped by name.
    """
    for i, func in enumerate(get.path):
        if func in sources or (ctor_rule and _made_by_constructors(get, i)):
            continue
        if i + 1 < len(get.path) and named_getter(func) and func not in sinks:
            continue
        return i
    return None


def _made_by_constructors(get: PathOp, i: int) -> bool:
    """Frame i of an init's path is the constructor's own frame or a function
    inlined there (map__init inlined into map__new2), each named as a constructor,
    and something called them."""
    return get.op == Role.INIT and i + 1 < len(get.path) and all(
        named_constructor(f) for f in get.path[:i + 1]) and all(
        f.vaddr == get.frames[0].vaddr for f in get.frames[1:i + 1])


def _maker_unknown(get: PathOp, i: int, base: Baseline) -> str:
    """Why the caller of an unnamed constructor is not named: a function that got a
    new object from a constructor probed at its return (fontconfig's FcNameParse
    from FcPatternCreate) may keep it or return it, and with no released object
    of the kind nothing tells which (on fontconfig, both happened).  A start
    function (main) returns nothing anyone keeps: it is the keeper.  "" otherwise."""
    if base.released or get.op != Role.INIT or i != 0 or len(get.path) < 2 \
            or named_constructor(get.path[0]) or get.path[0][1] in START_FUNCTIONS:
        return ""
    name, caller = frame_name(get.frames[0]), frame_name(get.frames[1])
    return (f"{name} made the object (no released object of its kind): whether {name} "
            f"kept it or returned it to {caller}, which kept it, is not decided")


def leaks_only(get: PathOp, i: int, base: Baseline) -> str:
    """Why the keeper (frame i) is not named when no object of the kind was released,
    several gets of the object could be the one left over, and only the leaked
    objects' own pairs show a function below it handing references up: which
    reference paired with which put is then the counts' guess (fontconfig's
    FcFreeTypeQueryFaceInternal hands a charset up through an out parameter and
    stores another reference of it in a pattern main destroys).  "" otherwise."""
    if base.released:
        return ""
    shown = [f for f in get.frames[:i] if func_key(f) in base.by_leaks]
    if not shown:
        return ""
    return (f"{frame_name(shown[-1])} handed the reference up only in the leaked objects' own "
            f"pairs, a guess when no object of the kind was released: {frame_name(shown[-1])} "
            f"or a caller up to {frame_name(get.frames[i])} kept it")


def verdict(get: PathOp, ops: list[PathOp], base: Baseline) -> list[Culprit] | str:
    """Culprit(s) of one unmatched get (several: a tie), or why none can be named."""
    direct = _expected_owner(get, ops, base)
    if direct is not None:
        return direct
    if get.op == Role.GET and base.released and not base.gets_put:
        return ("no get of the object's kind ever met a put (released objects dropped "
                "initial references only, and no leaked object's get was put): the "
                "function that releases what a get takes, which every caller uses, may "
                "have lost its put, and a caller that skipped it leaves the same counts")
    i = reference_holder(get, base.sources, not base.released, base.sinks)
    if i is None:
        return (f"every function on the path of the unmatched {get.op.name.lower()} "
                f"({len(get.path)} frames) hands references up to its caller: "
                "the stack is likely truncated")
    holder, frames = get.path[i], get.frames[:i + 1]
    if not get.frames[i].function:
        return (f"the reference was kept in code without a symbol ({frame_name(get.frames[i])}, "
                f"frame {i} of the unmatched {get.op.name.lower()}'s path): "
                "a symbol table for its module would name it")
    maker = _maker_unknown(get, i, base)
    if maker:
        return maker
    expected = base.expected.get(_expected_key(get), [])
    name = frame_name(get.frames[i])
    twice = _two_at_once(get, ops, i, base.get_sites)
    if twice is not None and not expected:
        j, twins = twice
        callee = frame_name(get.frames[j])
        return (f"{callee} took two references in one call ({_sites(get, twins, j)}) and "
                f"one was never put: whether {callee} took one too many or {name} kept "
                "one it should have put is not decided (no released object went through "
                "this call)")
    analog = same_role(get, ops, base.expected, base.callers) if not expected else []
    if analog:
        return analog
    if not expected and get.op == Role.INIT and base.released:
        return (f"the object's initial reference was never dropped; {name} created it and "
                "released objects of its kind dropped theirs elsewhere, so the function "
                "that should have is not on this path: the history's other operations "
                "show who used it")
    left = never_left(get, ops, i) if not expected else ""
    if left:
        return left
    if not expected:
        if any(op.op == Role.PUT and put_owner(op, base.callers) == holder for op in ops):
            unproven = [f for f in get.frames[:i] if func_key(f) not in base.handed]
            if not unproven:
                return [Culprit(EXTRA_GET, get.frames[i], frames, rule="puts-more", why=(
                    f"{name} puts this object, but got this reference as well; no "
                    "released object got a reference at this path, and released ones "
                    "show each function below it handing references up"))]
            # its own get one too many, or a callee that handed it one reference too
            # many (a getter's extra get): on real code (benchmarks/mutants) naming
            # the caller without evidence about its callees was right 1 time in 10
            callee = frame_name(unproven[-1])
            return (f"{name} puts this object and got one reference more than it put; "
                    f"whether its own get is the extra one or {callee} handed it a "
                    "reference too many is not decided: no released object shows "
                    f"{callee} handing references up")
        stores = _stores_for_another(get, i, base.type_name)
        if stores:
            return stores
        # the functions below it are taken to hand the reference up: a constructor
        # (the init's caller) and a getter by name do; any other one only on the
        # evidence of released pairs.  Leaked objects' own pairs made perf's
        # add_hist_entries look like one when it stashed references in a global
        # that put_fake_samples should put (benchmarks/mutants).
        unproven = [f for k, f in enumerate(get.frames[:i]) if func_key(f) not in base.handed
                    and not named_getter(func_key(f)) and (k or get.op != Role.INIT)]
        if unproven and base.released:
            callee = frame_name(unproven[-1])
            return (f"{name} kept a reference got through {callee}, and no released object "
                    f"shows {callee} handing references up: {callee} may have stored it "
                    f"(the put missing where that is dropped) or {name} may have kept it")
        return [Culprit(MISSING_PUT, get.frames[i], frames, rule="first-keeper", why=(
            f"{name} is the first function on the get's path that does not hand the "
            "reference to its caller; no released object got a reference at this path"))]
    put, n = max(expected, key=lambda e: e[1])
    where = short_frames(put.frames)
    owned = [p for p, _ in expected if put_owner(p, base.callers) == holder]
    died = died_in_maker(get, ops, owned[0], i, base.sources) if owned else ""
    if died:
        return died
    if owned:
        return [Culprit(MISSING_PUT, get.frames[i], frames, expected=put.frames,
                        rule="released-owner", why=(
            f"released objects got {n} such reference(s) here and {name} put them at "
            f"{where}; in this object it never did"))]
    mixed = _puts_its_own(get, base, i)
    if mixed:
        return mixed
    return _handover(get, ops, base, i, put, n)


def _puts_its_own(get: PathOp, base: Baseline, i: int) -> str:
    """Why a hand-over is not read from released objects whose holder (frame i) put,
    under this very path, as many references as they got at it.  Released objects'
    operations are pooled by path, not by object: pairing the pool can give one
    object's reference to another's teardown when the holder's own put balances
    either equally well (fontconfig's fc-cat: the arguments set made and destroyed
    in main, the configuration's sets put by FcFini, the cache's `dirs` set no
    longer destroyed, blamed on the function that listed it).  "" otherwise."""
    got = sum(op.count for op in base.released if is_get(op.op) and op.path == get.path)
    n = len(get.path)
    own = sum(op.count for op in base.released if op.op == Role.PUT and len(op.path) > n - 1
              and op.path[len(op.path) - n:] == get.path
              and put_owner(op, base.callers) == get.path[i])
    if not got or own < got:
        return ""
    name = frame_name(get.frames[i])
    return (f"released objects got {got} reference(s) at this path and {name} put {own} "
            f"itself, under the same calls: whether {name} or a function it handed the "
            "object to should have put this one is not decided by pooled counts")


def _twins(get: PathOp, ops: list[PathOp], j: int) -> list[PathOp]:
    """Other gets of the object made through the same calls as `get` except at
    frame j, as often: the same call of path[j] reached two get sites.  A frame
    that path[j] is inlined into shares its address, so it is the same call when
    its line is (fontconfig's FcParseInclude inlined into FcEndElement, two calls
    of FcRuleSetReference apart).  Two copies of an inlined getter on one line of
    its caller (perf's map__get) look the same: the caller may have called twice."""
    def same(k: int, a: Frame, b: Frame) -> bool:
        if k == j:
            return True
        if b.vaddr == get.frames[j].vaddr and k > j:  # inlined: compare the call line
            return bool(a.line) and (a.file, a.line) == (b.file, b.line)
        return a.vaddr == b.vaddr
    return [op for op in ops if op is not get and is_get(op.op) and op.path == get.path
            and op.count == get.count and op.frames[j].vaddr != get.frames[j].vaddr
            and all(same(k, a, b) for k, (a, b) in enumerate(zip(
                op.frames, get.frames, strict=True)))]


def _two_at_once(get: PathOp, ops: list[PathOp], holder: int,
                 released_sites: set[tuple[str, int]]) -> tuple[int, list[PathOp]] | None:
    """The frame below the holder whose one call took two references (perf's
    maps__find with a get added after its own), one of them at a call site no
    released object's get went through: its caller's missing put and the callee's
    extra get leave the same counts.  A function that always takes two (perf's
    threads__find: one for its last-match cache, one returned) shows both sites
    in released objects.  Returns that frame's index and the other gets."""
    for j in range(holder):
        twins = _twins(get, ops, j)
        if twins and any((op.frames[j].module, op.frames[j].vaddr) not in released_sites
                         for op in [get, *twins]):
            return j, twins
    return None


def _sites(get: PathOp, twins: list[PathOp], j: int) -> str:
    """The two call sites, by line where DWARF has it (else offset in the function)."""
    sites = sorted({f"{f.file.rsplit('/', 1)[-1]}:{f.line}" if f.line else f"+0x{f.offset:x}"
                    for f in (op.frames[j] for op in [get, *twins])})
    return f"at {', '.join(sites)}, {get.count} time(s) each"


def _expected_owner(get: PathOp, ops: list[PathOp], base: Baseline
                    ) -> list[Culprit] | str | None:
    """Released objects got references at this very path and one function on it put
    them: that function is where this one's put is missing, or, when this object
    has that put too, where the reference was got once more.  Direct evidence,
    before any rule about which callers hand references up."""
    expected = base.expected.get(_expected_key(get), [])
    if not expected:
        return None
    put, n = max(expected, key=lambda e: (e[1], in_time(e[0])))
    owner = put_owner(put, base.callers)
    if owner is None or owner not in get.path:
        return None
    k = get.path.index(owner)
    if not get.frames[k].function:
        return None
    died = died_in_maker(get, ops, put, k, base.sources)
    if died:
        return died
    name, where = frame_name(get.frames[k]), short_frames(put.frames)
    if any(op.op == Role.PUT and op.path == put.path for op in ops):
        return [Culprit(EXTRA_GET, get.frames[k], get.frames[:k + 1], expected=put.frames,
                        rule="released-path-extra",
                        why=(f"released objects got {n} such reference(s) here and {name} "
                             f"put them at {where}; this object was put there too, but got "
                             "one reference more"))]
    return [Culprit(MISSING_PUT, get.frames[k], get.frames[:k + 1], expected=put.frames,
                    rule="released-path-missing",
                    why=(f"released objects got {n} such reference(s) here and {name} put "
                         f"them at {where}; in this object it never did"))]


def _handover(get: PathOp, ops: list[PathOp], base: Baseline, i: int, put: PathOp,
              n: int) -> list[Culprit] | str:
    """Released objects had the reference put below its holder (handed over by
    design): blame the callee this object was handed to instead, if it is clear."""
    holder_frame, where = get.frames[i], short_frames(put.frames)
    candidates = handover_candidates(get, ops, base, put.path, len(get.path) - i)
    if not candidates:
        # on real code (benchmarks/mutants) this was never right: the reference had
        # been got once more below the holder (a get added in hist_entry__init)
        return (f"released objects had {n} such reference(s) put at {where}; this one "
                f"stayed on its way to {frame_name(holder_frame)}, and no function of the "
                "object's history below it shows where: a get too many below it or its "
                "missing put leave the same counts")
    names = tuple(sorted(frame_name(f) for f, _ in candidates.values()))
    out = []
    for frame, op in candidates.values():
        why = (f"released objects had {n} such reference(s) put at {where}; this one was "
               f"handed to {frame_name(frame)} instead (its operations at "
               f"{short_frames(op.frames)}), "
               "a path no released object took, and it never put it")
        out.append(Culprit(MISSING_PUT, frame, get.frames[:i + 1], expected=put.frames,
                           why=why, rule="handover", tie=names if len(names) > 1 else ()))
    return out


def handover_candidates(get: PathOp, ops: list[PathOp], base: Baseline,
                        expected: tuple[FuncKey, ...], min_depth: int
                        ) -> dict[FuncKey, tuple[Frame, PathOp]]:
    """Callees that saw this object where released objects had their put: the
    functions just inside the deepest outer part shared with the expected put's
    path, on paths no released object took."""
    best, found = min_depth, {}  # type: int, dict[FuncKey, tuple[Frame, PathOp]]
    for op in ops:
        depth = common_depth(op.path, expected)
        if op is get or depth < best or depth >= len(op.path):
            continue
        k = len(op.path) - depth - 1
        if op.path[k:] in base.suffixes or not _put_under(op.path[k:], ops):
            continue
        if depth > best:
            best, found = depth, {}
        found.setdefault(op.path[k], (op.frames[k], op))
    return found


def _put_under(suffix: tuple[FuncKey, ...], ops: list[PathOp]) -> bool:
    """Whether the object was put somewhere below this call: a consumer handed the
    reference uses it (and drops its temporary ones); a call that only got
    references (hist_entry__new storing one, the object's own constructor) was
    not handed anything."""
    return any(op.op == Role.PUT and op.path[len(op.path) - len(suffix):] == suffix
               for op in ops if len(op.path) > len(suffix))


def short_frames(frames: tuple[Frame, ...], limit: int = 4) -> str:
    names = [frame_name(f) for f in frames[:limit]]
    return " < ".join(names) + (" < ..." if len(frames) > limit else "")
