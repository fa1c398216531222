"""Pairing every put of one object (or of a baseline) with a get: references nest
like brackets, so the pairs that share the deepest caller are made first, then by
owner affinity (both pass through the same object's API below that caller).  The
reference sources and sinks of released objects, and what matched pairs show about
who handed a reference up, come from here too (attribution.py's docstring)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from refcntd.analysis.apinames import api_class, named_getter
from refcntd.analysis.pathops import FuncKey, PathOp, is_get
from refcntd.kernel.abi import Role


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
    return Pairs(ops, sources, sinks).pair()


Rank = tuple[int, int, bool, int, bool, int]


class Pairs:
    """Every get/put pair of one object, ranked by _match_rank, paired greedily.

    Ranks are computed level by level (the shared depth comes first in a rank)
    and only for pairs whose get and put both have references left when their
    level is reached: a released baseline of a thousand paths would otherwise
    rank a million pairs, most of them long settled."""

    def __init__(self, ops: list[PathOp], sources: set[FuncKey],
                 sinks: frozenset[FuncKey] | set[FuncKey], one_object: bool = True) -> None:
        self.gets = sorted((op for op in ops if is_get(op.op)), key=in_time)
        self.puts = sorted((op for op in ops if op.op == Role.PUT), key=in_time)
        self.everywhere = _everywhere(ops, one_object)  # what handed_up() must see too
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
    return Pairs(ops, sources, sinks).equal_leftovers()


def in_time(op: PathOp) -> tuple[int, tuple[FuncKey, ...], int]:
    """Operations in the order they first happened; a baseline's (no times) by path."""
    return (op.first_ns, op.path, op.count)


def handed_up(matches: list[Match], everywhere: frozenset[str]) -> dict[FuncKey, int]:
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
    no evidence.  pair() and handed_up() must see the same set (Pairs.everywhere)."""
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
