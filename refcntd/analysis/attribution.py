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

import functools
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

FuncKey = tuple[str, str]  # (module file name, function or raw address)
CulpritKey = tuple[str, FuncKey, tuple[FuncKey, ...]]

START_FUNCTIONS = frozenset({"main", "_start", "__libc_start_main", "__libc_start_call_main",
                             "start_thread"})
MISSING_PUT = "missing put"
EXTRA_GET = "extra get"


@dataclass(frozen=True)
class PathOp:
    """An operation (with multiplicity) at one symbolized path."""

    op: Role
    frames: tuple[Frame, ...]  # from the refcount call outward, stub frames dropped
    count: int
    first_ns: int = 0  # when it first / last happened at this path (0: not known)
    last_ns: int = 0

    @cached_property  # pairing compares paths of every get with every put
    def path(self) -> tuple[FuncKey, ...]:
        return tuple(func_key(f) for f in self.frames)


@dataclass
class Culprit:
    kind: str  # MISSING_PUT or EXTRA_GET
    function: Frame
    frames: tuple[Frame, ...]  # the unmatched get's path, up to and including the culprit
    objects: int = 0  # leaked objects of the group where this get stays unmatched
    references: int = 0  # unmatched references in those objects
    released_uses: int = 0  # gets through the same path in objects released correctly
    leaked_objects: set[int] = field(default_factory=set, repr=False)
    expected: tuple[Frame, ...] = ()  # where released objects put such a reference
    why: str = ""  # why this function and not another
    tie: tuple[str, ...] = ()  # functions with the same evidence, this one included
    holder: str = ""  # indirect leaks: the leaked object whose culprit this is
    # a missing put: the object's last operation made under the culprit's call (the
    # culprit's frame is the call after which the reference was dropped), when timed
    last_use: tuple[Frame, ...] = ()
    # found against an earlier run of the same workload (--baseline): that run's name
    baseline: str = ""
    # a missing put: where the culprit's code skips every put released objects made in
    # it (the branch of an early return), with their lines
    exits: tuple[Frame, ...] = ()

    def key(self) -> CulpritKey:
        return (self.kind, func_key(self.function), tuple(func_key(f) for f in self.frames))


def func_key(frame: Frame) -> FuncKey:
    if frame.function:
        return (frame.module.rsplit("/", 1)[-1], frame.function)
    return (frame.module.rsplit("/", 1)[-1], frame.raw or hex(frame.vaddr))


def is_get(op: Role) -> bool:
    return op in (Role.INIT, Role.GET)


def _balances(released: Iterable[PathOp]) -> dict[FuncKey, int]:
    """Per function: references got through it minus references put through it."""
    balance: dict[FuncKey, int] = {}
    for op in released:
        sign = 1 if is_get(op.op) else -1 if op.op == Role.PUT else 0
        for func in set(op.path):
            balance[func] = balance.get(func, 0) + sign * op.count
    return balance


def reference_sources(released: Iterable[PathOp]) -> set[FuncKey]:
    """Functions through which released objects got more references than they put."""
    return {func for func, value in _balances(released).items() if value > 0}


def reference_sinks(released: Iterable[PathOp]) -> set[FuncKey]:
    """Functions through which released objects put more references than they got."""
    return {func for func, value in _balances(released).items() if value < 0}


def put_wrappers(released: list[PathOp]) -> set[FuncKey]:
    """Sinks that never see a get: put wrappers (release()), not consumers that
    also look at the object before they put it."""
    on_gets = {func for op in released if is_get(op.op) for func in op.path}
    return reference_sinks(released) - on_gets


def put_callers(released: list[PathOp]) -> set[FuncKey]:
    """The put wrappers that call put themselves (path[0] of puts, never deeper):
    whose caller owns the put.  A consumer that hands the object to such a
    wrapper is where a handed-over reference ends, not a wrapper."""
    # only gets and puts: a delete stub called under the wrapper (perf's map__put <
    # map__delete < refcnt__delete) does not make the wrapper someone's callee
    deeper = {func for op in released if is_get(op.op) or op.op == Role.PUT
              for func in op.path[1:]}
    return {op.path[0] for op in released if op.op == Role.PUT and op.path} \
        & put_wrappers(released) - deeper


def put_owner(put: PathOp, sinks: frozenset[FuncKey] | set[FuncKey]) -> FuncKey | None:
    return next((func for func in put.path if func not in sinks), None)


def common_depth(a: tuple[FuncKey, ...], b: tuple[FuncKey, ...]) -> int:
    """Length of the common outer part (main side) of two paths."""
    depth = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):
        if x != y:
            break
        depth += 1
    return depth


Match = tuple[PathOp, PathOp, int]  # (get, put, references)


def pair(ops: list[PathOp], sources: set[FuncKey], sinks: frozenset[FuncKey] | set[FuncKey]
         = frozenset()) -> tuple[list[tuple[PathOp, int]], list[Match]]:
    """Pair every put of one object (or of a baseline) with a get.

    Returns the gets left over and the matches.  The pairs sharing the most
    of their paths are made first (references nest like brackets: a temporary
    get and its put share the deepest caller).
    """
    return _Pairs(ops, sources, sinks).pair()


Rank = tuple[int, int, bool, int, bool, int]


class _Pairs:
    """Every get/put pair of one object, ranked by _match_rank, paired greedily.

    Ranks are computed level by level (the shared depth comes first in a rank)
    and only for pairs whose get and put both have references left when their
    level is reached: a released baseline of a thousand paths would otherwise
    rank a million pairs, most of them long settled."""

    def __init__(self, ops: list[PathOp], sources: set[FuncKey],
                 sinks: frozenset[FuncKey] | set[FuncKey], one_object: bool = True) -> None:
        self.gets = sorted((op for op in ops if is_get(op.op)), key=_in_time)
        self.puts = sorted((op for op in ops if op.op == Role.PUT), key=_in_time)
        self.everywhere = _everywhere(ops, one_object)  # what _handed_up() must see too
        self._how = (sources, sinks, self.everywhere)
        levels: dict[int, list[tuple[int, int]]] = {}
        for gi, g in enumerate(self.gets):
            for pi, p in enumerate(self.puts):
                levels.setdefault(common_depth(g.path, p.path), []).append((gi, pi))
        self._levels = sorted(levels.items(), reverse=True)
        self._ranks: dict[tuple[int, int], Rank] = {}

    def _rank(self, gi: int, pi: int) -> Rank:
        rank = self._ranks.get((gi, pi))
        if rank is None:
            rank = self._ranks[gi, pi] = _match_rank(self.gets[gi], self.puts[pi], *self._how)
        return rank

    def greedy(self, left_g: list[int], left_p: list[int]
               ) -> tuple[list[int], list[tuple[int, int, int, Rank]]]:
        """Best-ranked pairs first, as many references as both sides have left.
        Equal ranks: the earliest get and put first, never the order the kernel's
        history slots happened to hold them in (hashes of addresses: other each run)."""
        matches = []
        for _, level in self._levels:
            live = sorted(((self._rank(gi, pi), gi, pi) for gi, pi in level
                           if left_g[gi] and left_p[pi]),
                          key=lambda r: (r[0], -r[1], -r[2]), reverse=True)
            for rank, gi, pi in live:
                n = min(left_g[gi], left_p[pi])
                if n:
                    left_g[gi] -= n
                    left_p[pi] -= n
                    matches.append((gi, pi, n, rank))
        return left_g, matches

    def pair(self) -> tuple[list[tuple[PathOp, int]], list[Match]]:
        """pair(): the gets left over and the matches."""
        left_g, matches = self.greedy([op.count for op in self.gets],
                                      [op.count for op in self.puts])
        return ([(op, n) for op, n in zip(self.gets, left_g, strict=True) if n > 0],
                [(self.gets[gi], self.puts[pi], n) for gi, pi, n, _ in matches])

    def equal_leftovers(self) -> list[PathOp]:
        """equal_leftovers(), on these ranks."""
        counts = [op.count for op in self.gets]
        put_counts = [op.count for op in self.puts]
        if sum(counts) <= sum(put_counts):
            return []
        best: tuple[tuple[Rank, int], ...] | None = None
        found: list[PathOp] = []
        for k, get in enumerate(self.gets):
            less = list(counts)
            less[k] -= 1
            quality = _quality(self.greedy(less, list(put_counts))[1])
            if best is None or quality > best:
                best, found = quality, [get]
            elif quality == best:
                found.append(get)
        return found


def _quality(matches: list[tuple[int, int, int, Rank]]) -> tuple[tuple[Rank, int], ...]:
    """How well a pairing nests, best pairs first: references per rank's evidence
    (shared depth, owner affinity, an initial reference dropped by its own
    caller), compared best first.  The rest of a rank only orders equals."""
    count: dict[Rank, int] = {}
    for _, _, n, rank in matches:
        key = rank[:3] + (0, False, 0)
        count[key] = count.get(key, 0) + n
    return tuple(sorted(count.items(), reverse=True))


def equal_leftovers(ops: list[PathOp], sources: set[FuncKey],
                    sinks: frozenset[FuncKey] | set[FuncKey] = frozenset()) -> list[PathOp]:
    """The gets any one of which could be the reference left without a put: taking
    one reference away from it leaves the rest paired as well as any other choice
    does.  pair() keeps one of them; when they lead to different functions the
    evidence does not decide between them (references of one object are
    exchangeable: counts say how many stayed, not which)."""
    return _Pairs(ops, sources, sinks).equal_leftovers()


def _in_time(op: PathOp) -> tuple[int, tuple[FuncKey, ...], int]:
    """Operations in the order they first happened; a baseline's (no times) by path."""
    return (op.first_ns, op.path, op.count)


def _handed_up(matches: list[Match], everywhere: frozenset[str]) -> dict[FuncKey, int]:
    """References per function that a matched pair passed up through, from its get
    to where it was put.  A put on another thread (no shared caller) shows
    nothing: not every caller of the get handed it over."""
    handed_up: dict[FuncKey, int] = {}
    for get, put, n in matches:
        path = get.path
        depth = common_depth(path, put.path)
        if not depth:
            continue
        stored = stored_at(get, put, depth, everywhere)
        # a reference stored into an owner (put by the owner's API) went no further
        # up than the owner's function; its callers never held it
        for func in set(path[:len(path) - depth if stored is None else stored + 1]):
            handed_up[func] = handed_up.get(func, 0) + n
    return handed_up


def kept_by_leaked(unmatched: Iterable[tuple[PathOp, int]]) -> dict[FuncKey, int]:
    """References per function on the path of a get left without a put."""
    kept: dict[FuncKey, int] = {}
    for get, n in unmatched:
        for func in set(get.path):
            kept[func] = kept.get(func, 0) + n
    return kept


def unmatched_gets(ops: list[PathOp], sources: set[FuncKey]) -> list[tuple[PathOp, int]]:
    """The gets of one object left over after pairing every put with a get."""
    return pair(ops, sources)[0]


@functools.lru_cache(maxsize=1 << 16)  # called for every get/put pair's frames
def api_class(func: FuncKey) -> str:
    """The object a C function works on, by the codebase's naming: perf's
    `map__new2`/`__dsos__add` -> map/dsos, GLib's `gst_bin_add` -> gst_bin.  An
    upper-case prefix is a symbol alias, not a class: fontconfig's hidden copies
    `IA__FcConfigDestroy` and `IA__FcConfigReference` share no object (read as
    class "IA", a charset's initial reference paired with the configuration's
    teardown by affinity: benchmarks/mutants, fcxml.c:1091)."""
    name = func[1].split(".")[0].lstrip("_")
    if "__" in name:
        prefix, rest = name.split("__", 1)
        return api_class((func[0], rest)) if prefix.isupper() else prefix
    words = name.split("_")
    return "_".join(words[:2]) if len(words) > 2 else ""


@functools.lru_cache(maxsize=1 << 16)  # the same inner paths, for every get/put pair
def _classes(path: tuple[FuncKey, ...], getters: bool = True) -> dict[str, int]:
    """Each API class on a path, at its innermost position (without getters: a
    lookup such as thread__find_map hands its reference up, it stores nothing)."""
    out: dict[str, int] = {}
    for i, func in enumerate(path):
        cls = "" if not getters and named_getter(func) else api_class(func)
        if cls:
            out.setdefault(cls, i)
    return out


def _everywhere(ops: list[PathOp], one_object: bool) -> frozenset[str]:
    """Classes on every get and put path of an object (its own type's get/put/new):
    no evidence.  pair() and _handed_up() must see the same set (_Pairs.everywhere)."""
    sets = [set(_classes(op.path)) for op in ops if is_get(op.op) or op.op == Role.PUT]
    if not sets:
        return frozenset()
    # one object's constructor names its own API (map__new, map__put): sharing it says
    # nothing about an owner.  Not for a baseline, whose constructors are many objects'.
    own = {api_class(op.path[0]) for op in ops if op.op == Role.INIT and op.path} \
        if one_object else set()
    return frozenset(set.intersection(*sets) | own - {""})


def affinity(get: PathOp, put: PathOp, depth: int, common: frozenset[str]) -> int:
    """How near the refcount calls a get and a put pass through the same object's
    API below their shared caller: a reference stored by `map__new2` is put by
    `map__put`/`map__delete` (the owner's destructor), not by `dsos__exit`."""
    shared = _shared(get, put, depth, common)
    return -min(shared)[0] if shared else -1000


def _shared(get: PathOp, put: PathOp, depth: int, common: frozenset[str]
            ) -> list[tuple[int, int]]:
    """(distance, index on the get's path) of each class both inner parts pass through."""
    inner_g = _classes(get.path[:len(get.path) - depth], getters=False)
    inner_p = _classes(put.path[:len(put.path) - depth])
    return [(inner_g[c] + inner_p[c], inner_g[c])
            for c in sorted(inner_g.keys() & inner_p.keys() - common)]


def stored_at(get: PathOp, put: PathOp, depth: int, common: frozenset[str]) -> int | None:
    """Index on the get's path of the owner's function that stored the reference the
    put releases, when their paths share an object's API below their shared caller."""
    shared = _shared(get, put, depth, common)
    return min(shared)[1] if shared else None


def _match_rank(get: PathOp, put: PathOp, sources: set[FuncKey],
                sinks: frozenset[FuncKey] | set[FuncKey], everywhere: frozenset[str] = frozenset()
                ) -> tuple[int, int, bool, int, bool, int]:
    """Deepest shared caller first.  Then: a put made by that caller itself drops
    its initial reference first (a put one call below it counts as its own: a
    put wrapper); a put made deeper (a consumer it handed the object to)
    balances a reference got from a getter first.  Among such puts the initial
    reference takes the one nearest the shared caller, a got one the farthest
    (the consumer calling a put wrapper, not the caller's own put)."""
    depth = common_depth(get.path, put.path)
    common = put.path[len(put.path) - depth] if depth else None
    below = len(put.path) - depth
    own_put = put_owner(put, sinks) == common or below == 1
    via_source = bool(get.path) and get.path[0] in sources
    is_init = get.op == Role.INIT
    return (depth, affinity(get, put, depth, everywhere), is_init == own_put,
            -below if is_init else below, via_source, len(get.frames))


def culprit_of(get: PathOp, ops: list[PathOp], sources: set[FuncKey], sinks: set[FuncKey]
               ) -> Culprit | None:
    """The first non-source function on the get's path, and whether it owns a put
    (the rule without a baseline; see verdict() for the full one)."""
    found = verdict(get, ops, Baseline.of([], sources, sinks))
    return found[0] if isinstance(found, list) else None


def attribute(objects: list[tuple[int, list[PathOp]]], released: list[PathOp]) -> list[Culprit]:
    """Culprits of a leak group: `objects` are (address, operations) of its leaked objects."""
    group = PairedGroup.of(objects, released)
    return judge(group, {addr: unmatched for addr, _, unmatched in group.objects}).culprits


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

    @classmethod
    def of(cls, released: list[PathOp], sources: set[FuncKey] | None = None,
           sinks: set[FuncKey] | None = None) -> Baseline:
        src = reference_sources(released) if sources is None else sources
        snk = reference_sinks(released) if sinks is None else sinks
        expected: dict[tuple[bool, tuple[FuncKey, ...]], list[tuple[PathOp, int]]] = {}
        wrappers = put_wrappers(released)
        pairs = _Pairs(released, src, wrappers, one_object=False)
        matches = pairs.pair()[1]
        for get, put, n in matches:
            expected.setdefault(_expected_key(get), []).append((put, n))
        suffixes = {op.path[k:] for op in released for k in range(len(op.path))}
        return cls(released, src, snk, wrappers, expected, suffixes,
                   put_callers(released), set(_handed_up(matches, pairs.everywhere)),
                   {(f.module, f.vaddr) for op in released if is_get(op.op)
                    for f in op.frames})


def _expected_key(get: PathOp) -> tuple[bool, tuple[FuncKey, ...]]:
    """Released pairs speak for a get made at the same path in the same way: an
    initial reference made there (a constructor's call) and a reference taken on an
    existing object there are different references, whose puts are elsewhere
    (fontconfig's FcParseInclude makes a rule set that FcConfigCleanup puts and
    takes a reference on the set it flushes, which FcConfigDestroy puts)."""
    return get.op == Role.INIT, get.path


# Name words of functions that return a new reference by convention (perf's
# thread__get, dsos__find_kernel_dso, machine__findnew_thread; GLib's gst_pad_get_peer,
# g_object_ref, g_strdup): a getter called once leaves no released object to learn
# it from, and was blamed as the keeper.  Not "new"/"init": a constructor keeps the
# references it takes for the object it builds.
GETTER_WORDS = frozenset({"get", "ref", "find", "findnew", "lookup", "dup", "copy", "clone"})


@functools.lru_cache(maxsize=1 << 16)
def name_words(func: FuncKey) -> list[str]:
    """The words of a C function's name (`__maps__insert_sorted.isra.0` -> maps,
    insert, sorted; fontconfig's `FcPatternDuplicate` -> fc, pattern, duplicate),
    what the naming conventions below read."""
    name = CAMEL.sub(r"\1_\2", func[1].split(".")[0])
    return [w for w in name.lower().split("_") if w]


CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def named_getter(func: FuncKey) -> bool:
    """Whether a function's name says it hands a reference to its caller."""
    return any(w in GETTER_WORDS for w in name_words(func)) and func[1] not in START_FUNCTIONS


# Name words of functions that make an object and return it (perf's dso__new_id,
# map__clone, nsinfo__alloc and the map__init inlined into map__new2; GLib's
# g_object_new; fontconfig's FcPatternDuplicate)
CONSTRUCTOR_WORDS = GETTER_WORDS | {"new", "init", "create", "alloc", "construct",
                                    "duplicate"}


def named_constructor(func: FuncKey) -> bool:
    """Whether a function's name says it makes the object it returns."""
    return bool(CONSTRUCTOR_WORDS & {w.rstrip("0123456789") for w in name_words(func)}) \
        and func[1] not in START_FUNCTIONS


STORER_WORDS = frozenset({"new", "init", "add", "insert", "create", "append", "prepend",
                          "push", "set", "attach", "store"})


def _stores_for_another(get: PathOp, i: int) -> str:
    """Why a constructor or inserter of another object that kept the reference is
    not named: it stored the reference in that object, so the put is missing where
    that object is destroyed or the reference removed, which no path of this
    object shows (perf's map__new keeps the dso that map__exit should put)."""
    func, own = get.path[i], api_class(get.path[0]) if get.path else ""
    words = {w.rstrip("0123456789") for w in name_words(func)}  # map__new2
    cls = api_class(func)
    if not cls or cls == own or not STORER_WORDS & words:
        return ""
    return (f"{_name(get.frames[i])} stored the reference in a {cls} it builds or fills "
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
    name, caller = _name(get.frames[0]), _name(get.frames[1])
    return (f"{name} made the object (no released object of its kind): whether {name} "
            f"kept it or returned it to {caller}, which kept it, is not decided")


def _leaks_only(get: PathOp, i: int, base: Baseline) -> str:
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
    return (f"{_name(shown[-1])} handed the reference up only in the leaked objects' own "
            f"pairs, a guess when no object of the kind was released: {_name(shown[-1])} "
            f"or a caller up to {_name(get.frames[i])} kept it")


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
        return (f"the reference was kept in code without a symbol ({_name(get.frames[i])}, "
                f"frame {i} of the unmatched {get.op.name.lower()}'s path): "
                "a symbol table for its module would name it")
    maker = _maker_unknown(get, i, base)
    if maker:
        return maker
    expected = base.expected.get(_expected_key(get), [])
    name = _name(get.frames[i])
    twice = _two_at_once(get, ops, i, base.get_sites)
    if twice is not None and not expected:
        j, twins = twice
        callee = _name(get.frames[j])
        return (f"{callee} took two references in one call ({_sites(get, twins, j)}) and "
                f"one was never put: whether {callee} took one too many or {name} kept "
                "one it should have put is not decided (no released object went through "
                "this call)")
    if not expected and get.op == Role.INIT and base.released:
        return (f"the object's initial reference was never dropped; {name} created it and "
                "released objects of its kind dropped theirs elsewhere, so the function "
                "that should have is not on this path: the history's other operations "
                "show who used it")
    if not expected:
        if any(op.op == Role.PUT and put_owner(op, base.callers) == holder for op in ops):
            unproven = [f for f in get.frames[:i] if func_key(f) not in base.handed]
            if not unproven:
                return [Culprit(EXTRA_GET, get.frames[i], frames, why=(
                    f"{name} puts this object, but got this reference as well; no "
                    "released object got a reference at this path, and released ones "
                    "show each function below it handing references up"))]
            # its own get one too many, or a callee that handed it one reference too
            # many (a getter's extra get): on real code (benchmarks/mutants) naming
            # the caller without evidence about its callees was right 1 time in 10
            callee = _name(unproven[-1])
            return (f"{name} puts this object and got one reference more than it put; "
                    f"whether its own get is the extra one or {callee} handed it a "
                    "reference too many is not decided: no released object shows "
                    f"{callee} handing references up")
        stores = _stores_for_another(get, i)
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
            callee = _name(unproven[-1])
            return (f"{name} kept a reference got through {callee}, and no released object "
                    f"shows {callee} handing references up: {callee} may have stored it "
                    f"(the put missing where that is dropped) or {name} may have kept it")
        return [Culprit(MISSING_PUT, get.frames[i], frames, why=(
            f"{name} is the first function on the get's path that does not hand the "
            "reference to its caller; no released object got a reference at this path"))]
    put, n = max(expected, key=lambda e: e[1])
    where = _short(put.frames)
    if any(put_owner(p, base.callers) == holder for p, _ in expected):
        return [Culprit(MISSING_PUT, get.frames[i], frames, expected=put.frames, why=(
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
    name = _name(get.frames[i])
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


def _expected_owner(get: PathOp, ops: list[PathOp], base: Baseline) -> list[Culprit] | None:
    """Released objects got references at this very path and one function on it put
    them: that function is where this one's put is missing, or, when this object
    has that put too, where the reference was got once more.  Direct evidence,
    before any rule about which callers hand references up."""
    expected = base.expected.get(_expected_key(get), [])
    if not expected:
        return None
    put, n = max(expected, key=lambda e: (e[1], _in_time(e[0])))
    owner = put_owner(put, base.callers)
    if owner is None or owner not in get.path:
        return None
    k = get.path.index(owner)
    if not get.frames[k].function:
        return None
    name, where = _name(get.frames[k]), _short(put.frames)
    if any(op.op == Role.PUT and op.path == put.path for op in ops):
        return [Culprit(EXTRA_GET, get.frames[k], get.frames[:k + 1], expected=put.frames,
                        why=(f"released objects got {n} such reference(s) here and {name} "
                             f"put them at {where}; this object was put there too, but got "
                             "one reference more"))]
    return [Culprit(MISSING_PUT, get.frames[k], get.frames[:k + 1], expected=put.frames,
                    why=(f"released objects got {n} such reference(s) here and {name} put "
                         f"them at {where}; in this object it never did"))]


def _handover(get: PathOp, ops: list[PathOp], base: Baseline, i: int, put: PathOp,
              n: int) -> list[Culprit] | str:
    """Released objects had the reference put below its holder (handed over by
    design): blame the callee this object was handed to instead, if it is clear."""
    holder_frame, where = get.frames[i], _short(put.frames)
    candidates = handover_candidates(get, ops, base, put.path, len(get.path) - i)
    if not candidates:
        # on real code (benchmarks/mutants) this was never right: the reference had
        # been got once more below the holder (a get added in hist_entry__init)
        return (f"released objects had {n} such reference(s) put at {where}; this one "
                f"stayed on its way to {_name(holder_frame)}, and no function of the "
                "object's history below it shows where: a get too many below it or its "
                "missing put leave the same counts")
    names = tuple(sorted(_name(f) for f, _ in candidates.values()))
    out = []
    for frame, op in candidates.values():
        why = (f"released objects had {n} such reference(s) put at {where}; this one was "
               f"handed to {_name(frame)} instead (its operations at {_short(op.frames)}), "
               "a path no released object took, and it never put it")
        out.append(Culprit(MISSING_PUT, frame, get.frames[:i + 1], expected=put.frames,
                           why=why, tie=names if len(names) > 1 else ()))
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


def _name(frame: Frame) -> str:
    return frame.function or f"0x{frame.vaddr:x}"


def _short(frames: tuple[Frame, ...], limit: int = 4) -> str:
    names = [_name(f) for f in frames[:limit]]
    return " < ".join(names) + (" < ..." if len(frames) > limit else "")


# ---- a leak group ---------------------------------------------------------------
@dataclass
class PairedGroup:
    """A leak group's objects with their puts paired, and its baseline."""

    base: Baseline
    objects: list[tuple[int, list[PathOp], list[tuple[PathOp, int]]]]  # addr, ops, unmatched
    # per object with a leftover: the gets that could as well be it (equal_leftovers)
    alternatives: dict[int, list[PathOp]] = field(default_factory=dict)

    @classmethod
    def of(cls, objects: list[tuple[int, list[PathOp]]], released: list[PathOp]
           ) -> PairedGroup:
        base = Baseline.of(released)
        paired: list[tuple[int, list[PathOp], list[tuple[PathOp, int]]]] = []
        alternatives: dict[int, list[PathOp]] = {}
        seen: dict[object, list[int]] = {}
        # the leaked objects' own pairs are evidence too, but they hold the bug: a
        # function whose references were left over more often than handed up keeps them
        handed: Counter[FuncKey] = Counter()
        kept: Counter[FuncKey] = Counter()
        gets_put = any(op.op == Role.GET for op in released)
        for addr, ops in objects:
            pairs = _Pairs(ops, base.sources, base.wrappers)
            unmatched, matches = pairs.pair()
            paired.append((addr, ops, unmatched))
            handed.update(_handed_up(matches, pairs.everywhere))
            gets_put = gets_put or any(g.op == Role.GET for g, _, _ in matches)
            kept.update(kept_by_leaked(unmatched))
            if not unmatched:
                continue
            # objects with the same history (perf's thousands of maps) are judged once
            shape = tuple((op.op, op.path, op.count) for op in ops)
            if shape not in seen:
                seen[shape] = [ops.index(a) for a in pairs.equal_leftovers()]
            alternatives[addr] = [ops[k] for k in seen[shape]]
        own = {func for func, n in handed.items() if n >= kept[func]}
        base.by_leaks = own - base.sources
        base.gets_put = gets_put
        base.sources |= own
        return cls(base, paired, alternatives)


@dataclass
class Verdict:
    """A group's answer: FOUND, TIE or UNKNOWN (or, set by the ownership pass,
    indirect / cycle), why, and the culprits ranked."""

    status: str
    reason: str = ""
    culprits: list[Culprit] = field(default_factory=list)
    notes: tuple[str, ...] = ()  # what was left out, with counts


def judge(group: PairedGroup, free: dict[int, list[tuple[PathOp, int]]]) -> Verdict:
    """Culprits of the unmatched gets in `free` (per object: those no leaked object holds)."""
    found: dict[CulpritKey, Culprit] = {}
    unknown: dict[str, int] = {}
    for addr, ops, _ in group.objects:
        for get, left in free.get(addr, []):
            result = verdict(get, ops, group.base)
            if not isinstance(result, str):
                result = _undecided(get, result, group.alternatives.get(addr, []), ops,
                                    group.base)
            if isinstance(result, str):
                unknown[result] = unknown.get(result, 0) + left
                continue
            for culprit in result:
                culprit = found.setdefault(culprit.key(), culprit)
                # a keeper's own missing put (not a consumer it was handed to)
                if culprit.kind == MISSING_PUT and not culprit.last_use \
                        and culprit.frames and culprit.function == culprit.frames[-1]:
                    culprit.last_use = last_use(get, len(culprit.frames) - 1, ops)
                culprit.leaked_objects.add(addr)
                culprit.references += left
    culprits = _ranked(found.values(), group.base.released)
    return _verdict(culprits, unknown)


def last_use(get: PathOp, i: int, ops: list[PathOp]) -> tuple[Frame, ...]:
    """The path, up to the keeper (frame i of the get's path), of the object's last
    operation made under the keeper's call on the same outer path: the keeper's
    frame there is the call after which the reference was dropped (issue 31: name
    the exit path's line, not only the function).  () when the operations are not
    timed, or when the last one is the get itself (nothing later to point at)."""
    outer = get.path[i:]
    n = len(outer)
    under = [op for op in ops if op.last_ns and len(op.path) >= n and op.path[-n:] == outer]
    if not under:
        return ()
    last = max(under, key=lambda op: (op.last_ns, op.path))
    k = len(last.path) - n
    if last is get or last.frames[k].vaddr == get.frames[i].vaddr:
        return ()
    return last.frames[:k + 1]


def _undecided(get: PathOp, result: list[Culprit], alternatives: list[PathOp],
               ops: list[PathOp], base: Baseline) -> list[Culprit] | str:
    """Why no culprit can be named when another get of the object could as well be
    the one left without a put and leads to another function (references of one
    object are exchangeable: counts say how many stayed, not which); else the
    culprits found."""
    if get not in alternatives or len(alternatives) < 2:
        return result
    named: dict[str, list[str]] = {}
    for other in alternatives:
        found = verdict(other, ops, base) if other is not get else result
        # a get whose own culprit cannot be named is another outcome too
        for label in [_name(c.function) for c in found] if isinstance(found, list) \
                else ["no function named"]:
            named.setdefault(label, []).append(_short(other.frames, 2))
    if len(named) <= 1:  # all lead to one function, which only a guess may show
        held = len(result[0].frames) if result else 0  # the culprit's: the get's, up to it
        guess = _leaks_only(get, held - 1, base) if held and \
            result[0].frames == get.frames[:held] else ""
        return guess or result
    seen = "; ".join(f"{name} (get at {', '.join(at)})" for name, at in sorted(named.items()))
    return (f"{len(alternatives)} gets of the object pair off with its puts equally well, "
            f"and which one stayed is not decided by the counts; each leads to another "
            f"function: {seen}; the object's order of gets and puts would decide")


def _ranked(found: Iterable[Culprit], released: list[PathOp]) -> list[Culprit]:
    for culprit in found:
        culprit.objects = len(culprit.leaked_objects)
        prefix = tuple(func_key(f) for f in culprit.frames)
        culprit.released_uses = sum(op.count for op in released
                                    if is_get(op.op) and op.path[:len(prefix)] == prefix)
    return sorted(found, key=lambda c: (-c.objects, -c.references, c.released_uses,
                                        c.function.function))


GAPS_SHOWN = 3  # reasons in a verdict's text, most references first


def _verdict(culprits: list[Culprit], unknown: dict[str, int]) -> Verdict:
    common = sorted(unknown.items(), key=lambda kv: (-kv[1], kv[0]))
    gaps = tuple(f"{n} unmatched reference(s) not attributed: {why}"
                 for why, n in common[:GAPS_SHOWN])
    if len(common) > GAPS_SHOWN:
        rest = sum(n for _, n in common[GAPS_SHOWN:])
        gaps += (f"{rest} more unmatched reference(s) not attributed, for "
                 f"{len(common) - GAPS_SHOWN} other reason(s)",)
    if not culprits:
        if gaps:
            return Verdict(UNKNOWN, "; ".join(gaps))
        return Verdict(UNKNOWN, "no get was left without a put in the recorded history")
    top = culprits[0]
    rank = (top.objects, top.references, top.released_uses)
    level = [c for c in culprits if (c.objects, c.references, c.released_uses) == rank]
    names = sorted({_name(c.function) for c in level} | set(top.tie))
    if len(names) > 1:
        return Verdict(TIE, f"{len(names)} functions have the same evidence: "
                       f"{', '.join(names)}", culprits, gaps)
    for c in level:  # one function, several paths to it: no tie of one
        c.tie = ()
    return Verdict(FOUND, top.why, culprits, gaps)
