"""Who holds each outstanding reference of a leaked object, and LSan's
direct / indirect split on refcounts.

The evidence is the get/put history alone (no memory scan): a reference
left unmatched in a leaked child C is *held by* a leaked object O when the
function that kept it (the first on the get's path that does not hand
references up) is O's constructor, or a function that handed O's own
reference up to its caller and builds no object itself, on the very same
outer path as O's init:

    owner_new(c) { o = alloc(); init(o); o->child = child_get(c); return o; }

Among several such leaked objects the one initialised nearest in time to
the get is taken (the same call of owner_new).  A leaked object with a
reference nobody of them holds is a *direct* leak; one whose references are
all held by leaked objects is *indirect* (fixing its holders' leak fixes it);
objects that only hold each other form a *cycle*.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from refcntd.analysis.attribution import reference_holder
from refcntd.analysis.judging import PairedGroup
from refcntd.analysis.pathops import START_FUNCTIONS, FuncKey, PathOp
from refcntd.kernel.abi import Role

DIRECT, INDIRECT, CYCLE = "direct", "indirect", "cycle"


@dataclass
class Leaked:
    """One leaked object with history, as the ownership pass sees it."""

    address: int
    type_name: str
    init_ns: int
    group: PairedGroup
    ops: list[PathOp]
    unmatched: list[tuple[PathOp, int]]

    @cached_property  # compared with every candidate holder's (perf: thousands)
    def init_path(self) -> tuple[FuncKey, ...]:
        return next((op.path for op in self.ops if op.op == Role.INIT), ())


@dataclass(frozen=True)
class Holding:
    holder: int  # address of the leaked object that holds the reference
    held: int
    get: PathOp  # where the held reference was got
    references: int


@dataclass
class Ownership:
    holdings: list[Holding] = field(default_factory=list)
    free: dict[int, list[tuple[PathOp, int]]] = field(default_factory=dict)  # not held
    leak: dict[int, str] = field(default_factory=dict)  # address -> DIRECT/INDIRECT/CYCLE
    roots: dict[int, set[int]] = field(default_factory=dict)  # indirect -> direct holders
    cycles: list[tuple[int, ...]] = field(default_factory=list)


def ownership(objs: list[Leaked], constructors: frozenset[FuncKey] = frozenset()
              ) -> Ownership:
    """constructors: functions that call init themselves (of any type, leaked or
    released objects); such a function keeps the references it takes for the
    object it builds, not for one a constructor wrapper handed it."""
    out = Ownership()
    # owners by each outer part of their init path that built them (_built_in): one
    # look-up per get instead of a scan of every leaked object (perf: 7000 of them)
    built: dict[tuple[FuncKey, ...], _Built] = {}
    for obj in objs:
        path = obj.init_path
        for j in range(len(path)):
            if _built_in(obj, path[j:], constructors):
                built.setdefault(path[j:], _Built()).add(obj)
    for entry in built.values():
        entry.objs.sort(key=lambda o: (o.init_ns, o.address))
        entry.times = [o.init_ns for o in entry.objs]
    for obj in objs:
        out.free[obj.address] = []
        total = sum(left for _, left in obj.unmatched)
        wanted = [(get, left, _candidates(obj, get, built, total))
                  for get, left in obj.unmatched]
        held = _assign(obj, wanted)
        out.holdings += held
        for get, left, _ in wanted:
            rest = left - sum(h.references for h in held if h.get is get)
            if rest:
                out.free[obj.address].append((get, rest))
    _classify(objs, out)
    return out


@dataclass
class _Built:
    """The leaked objects built at one outer path, by init time."""

    objs: list[Leaked] = field(default_factory=list)
    times: list[int] = field(default_factory=list)  # their init_ns, sorted
    paths: dict[tuple[FuncKey, ...], int] = field(default_factory=dict)  # init path: count
    addresses: set[int] = field(default_factory=set)

    def add(self, obj: Leaked) -> None:
        self.objs.append(obj)
        self.paths[obj.init_path] = self.paths.get(obj.init_path, 0) + 1
        self.addresses.add(obj.address)

    def nearest(self, obj: Leaked, own: tuple[FuncKey, ...] | None, get: PathOp,
                total: int) -> list[Leaked]:
        """The `total` objects initialised nearest to the get, other than `obj` (and,
        for an init, than those built at its own init path): _assign never goes
        further (it gives each of the object's `total` references to a distinct
        holder, nearest first)."""
        excluded = self.paths.get(own, 0) if own is not None else \
            int(obj.address in self.addresses)
        if len(self.objs) <= excluded:
            return []

        def eligible(o: Leaked) -> bool:
            return o is not obj and (own is None or o.init_path != own)

        when = get.first_ns or get.last_ns
        cut = bisect.bisect_right(self.times, when)
        before = _scan(self.objs, range(cut - 1, -1, -1), eligible, total)
        after = _scan(self.objs, range(cut, len(self.objs)), eligible, total)
        return heapq.nsmallest(total, before + after,
                               key=lambda o: (_distance(o.init_ns, get), o.address))


def _scan(objs: list[Leaked], order: range, eligible: Callable[[Leaked], bool], total: int
          ) -> list[Leaked]:
    """The first `total` eligible objects in `order`, and any initialised at the same
    time as the last of them (their addresses break the tie)."""
    out: list[Leaked] = []
    for i in order:
        o = objs[i]
        if len(out) >= total and o.init_ns != out[-1].init_ns:
            break
        if eligible(o):
            out.append(o)
    return out


def _candidates(obj: Leaked, get: PathOp, built: dict[tuple[FuncKey, ...], _Built],
                total: int) -> list[Leaked]:
    """The leaked objects built where the reference went, nearest in time: for the
    first function on the get's path, up to the one that kept it, that constructed
    leaked objects."""
    base = obj.group.base
    i = reference_holder(get, base.sources, not base.released, base.sinks)
    last = len(get.path) - 1 if i is None else i
    own = obj.init_path if get.op == Role.INIT else None
    for k in range(1 if get.op == Role.INIT else 0, last + 1):  # init's caller built it
        entry = built.get(get.path[k:])
        found = entry.nearest(obj, own, get, total) if entry is not None else []
        if found:
            return found
    return []


def _assign(obj: Leaked, wanted: list[tuple[PathOp, int, list[Leaked]]]) -> list[Holding]:
    """Each held reference to one holder, the call of the constructor that got it:
    the holder initialised last before the get (else first after it), distinct
    holders first; references beyond the holders go to the nearest one."""
    pairs = sorted(((_distance(o.init_ns, get), n, o) for n, (get, _, cands) in enumerate(wanted)
                    for o in cands), key=lambda p: (p[0], p[2].address))
    left = [w[1] for w in wanted]
    shares: dict[tuple[int, int], int] = {}
    used: set[int] = set()
    for rounds in (0, 1):
        for _, n, o in pairs:
            if left[n] and (rounds or o.address not in used):
                take = 1 if not rounds else left[n]
                shares[(n, o.address)] = shares.get((n, o.address), 0) + take
                left[n] -= take
                used.add(o.address)
    return [Holding(addr, obj.address, wanted[n][0], refs) for (n, addr), refs in shares.items()]


def _distance(init_ns: int, get: PathOp) -> tuple[bool, int]:
    when = get.first_ns or get.last_ns
    return (init_ns > when, abs(init_ns - when))


def _built_in(owner: Leaked, tail: tuple[FuncKey, ...], constructors: frozenset[FuncKey]
              ) -> bool:
    """Whether the function tail[0] (with its outer path tail) created `owner` and
    handed it up: its constructor, or a function returning what one made."""
    path = owner.init_path
    j = len(path) - len(tail)
    if j < 0 or path[j:] != tail:
        return False
    func = tail[0]
    base = owner.group.base
    if j == 0:
        return func[1] not in START_FUNCTIONS
    # a function that got the owner from a constructor wrapper and builds objects of
    # its own (perf's map__new: nsinfo__copy's nsinfo, and the map it inits) keeps a
    # child reference for its own object: taking it for the owner inverted ownership.
    # Nor does one hand the owner up that released owners show keeping it: perf's
    # dso__new_map puts its dso and returns the map that holds it.
    return func in base.sources and func not in constructors and (
        not base.released or func in base.handed)


def _classify(objs: list[Leaked], out: Ownership) -> None:
    holds: dict[int, set[int]] = {}
    for h in out.holdings:
        holds.setdefault(h.holder, set()).add(h.held)
    direct = [o.address for o in objs if out.free[o.address]]
    for addr in direct:
        out.leak[addr] = DIRECT
    for root in direct:
        for addr in _reachable(root, holds):
            if out.leak.get(addr) != DIRECT:
                out.leak[addr] = INDIRECT
                out.roots.setdefault(addr, set()).add(root)
    rest = {o.address for o in objs if o.address not in out.leak}
    for scc in _cycles(rest, holds):
        out.cycles.append(tuple(sorted(scc)))
        for addr in scc:
            out.leak[addr] = CYCLE
        for addr in set().union(*(_reachable(a, holds) for a in scc)) - set(scc):
            if addr not in out.leak:
                out.leak[addr] = INDIRECT
                out.roots.setdefault(addr, set()).update(scc)


def _reachable(root: int, holds: dict[int, set[int]]) -> set[int]:
    seen: set[int] = set()
    todo = [root]
    while todo:
        for nxt in holds.get(todo.pop(), ()):
            if nxt not in seen and nxt != root:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _cycles(nodes: set[int], holds: dict[int, set[int]]) -> list[set[int]]:
    """Strongly connected sets of objects holding each other (size 2 or more)."""
    out: list[set[int]] = []
    done: set[int] = set()
    for node in sorted(nodes):
        if node in done:
            continue
        reach = _reachable(node, holds) & nodes
        scc = {node} | {n for n in reach if node in _reachable(n, holds)}
        done |= scc
        if len(scc) > 1:
            out.append(scc)
    return out
