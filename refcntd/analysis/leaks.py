"""From drained object records to symbolized, grouped leaks of one process."""

from __future__ import annotations

import heapq
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import overload

from refcntd.analysis import evidencedump
from refcntd.analysis.culpritlines import place_lines
from refcntd.analysis.model import (
    AnomalyFinding,
    AnomalyKey,
    HistoryStep,
    LeakedObject,
    LeakGroup,
    LeakKey,
    SiteGroup,
    StackUnwind,
)
from refcntd.analysis.pathops import PathOp
from refcntd.analysis.tailcalls import with_tail_calls
from refcntd.analysis.verdicts import Evidence, evidence_gap, judge_process
from refcntd.kernel.abi import TRUNCATION_TEXT, UNWINDMETHOD_TEXT, Role, Truncation
from refcntd.kernel.columns import ObjectColumns
from refcntd.kernel.records import (
    AnomalyRecord,
    ObjectRecord,
    RawFrame,
    ReleasedSite,
    SiteLive,
    StackRecord,
    StackRef,
    Totals,
    add_totals,
)
from refcntd.symbolize.perfmap import PerfMap
from refcntd.symbolize.symbolizer import Frame, Symbolizer


@dataclass
class StackSource:
    """Read access to the kernel's stack store (kernel.parts.Objects.stack_record)."""

    record: Callable[[int], StackRecord | None]


@dataclass
class ProcessModules:
    """Load biases learnt for one process, and its stacks already symbolized:
    objects of one process mostly share a few allocation stacks."""

    biases: dict[str, int] = field(default_factory=dict)
    stacks: dict[StackRef, tuple[tuple[Frame, ...], bool]] = field(default_factory=dict)
    paths: dict[StackRef, tuple[Frame, ...]] = field(default_factory=dict)  # _op_frames
    perf_map: PerfMap | None = None  # the process's JIT symbols (/tmp/perf-PID.map)


@dataclass
class HistoryContext:
    """What attribution needs besides the leaked objects themselves."""

    stub_names: frozenset[str]  # the probed functions: dropped from operation paths
    released: list[ReleasedSite] = field(default_factory=list)


def group_leaks(records: list[ObjectRecord], stacks: StackSource, sym: Symbolizer,
                now_ns: int, mods: ProcessModules | None = None,
                history: HistoryContext | None = None) -> list[LeakGroup]:
    """Group by (type, allocation stack), most objects first, then by type name."""
    mods = mods or ProcessModules()
    # cheap key first: objects share few stacks
    by_ref: dict[tuple[str, int, StackRef], LeakGroup] = {}
    groups: dict[LeakKey, LeakGroup] = {}
    paths: dict[LeakKey, list[Evidence]] = {}
    for rec in records:
        ref = (rec.type_name, rec.name_ptr, _alloc_ref(rec))
        if ref not in by_ref:  # the stack first: it teaches the biases the name may need
            frames, truncated = shown_stack(ref[2], stacks, sym, mods)
            type_name = _type_name(rec.type_name, rec.name_ptr, sym, mods)
            unwind = stack_unwind(ref[2], stacks)
            group = LeakGroup(type_name, frames, stack_truncated=truncated or
                              unwind.truncated_at is not None, unwind=unwind)
            by_ref[ref] = groups.setdefault(group.key(), group)
        group = by_ref[ref]
        steps, ops = _history(rec, stacks, sym, mods, history)
        group.objects.append(LeakedObject(rec.addr, rec.count, rec.gets, rec.puts,
                                          max(0, now_ns - rec.init_ns), steps,
                                          rec.history.total_ops if rec.history else 0))
        if rec.history is not None and history is not None:
            paths.setdefault(group.key(), []).append(_evidence(rec, group.type_name, ops))
    if paths and history is not None:
        leaked = _leaked_sites(records)
        shown = _released_types(stacks, sym, mods, history)
        released = {key: _released_paths(key[0], shown, stacks, sym, mods, history, leaked)
                    for key in paths}
        evidencedump.dump(list(groups.values()), paths, released)
        judge_process(list(groups.values()), paths, released)
        place_lines(groups.values(), sym)
    for group in groups.values():
        group.objects.sort(key=lambda o: o.address)
    return sorted(groups.values(), key=LeakGroup.order)


def group_sites(sites: list[SiteLive], stacks: StackSource, sym: Symbolizer, now_ns: int,
                since: bool = False) -> list[SiteGroup]:
    """One process's per-site counts (kernel.parts.SiteMaps.site_lives) as groups by
    (type, allocation stack), each stack symbolized once; `since`: only objects created
    since the checkpoint, most first."""
    mods = ProcessModules()
    groups: dict[LeakKey, SiteGroup] = {}
    for site in sites:  # two stack ids may symbolize alike (a first walk cut earlier)
        frames, truncated = shown_stack(site.stack, stacks, sym, mods)
        unwind = stack_unwind(site.stack, stacks)
        new = SiteGroup(_type_name(site.type_name, site.name_ptr, sym, mods), frames, unwind,
                        truncated or unwind.truncated_at is not None, 0, 0)
        group = groups.setdefault(new.key(), new)
        ages = group.since_mean_age_ns * group.since + (
            max(0, now_ns - site.since_mean_ns) * site.since if site.since else 0)
        group.live += site.live
        group.created += site.created
        group.since += site.since
        group.since_mean_age_ns = ages // group.since if group.since else 0
    order = (lambda g: (-g.since, g.key())) if since else (lambda g: (-g.live, g.key()))
    return sorted((g for g in groups.values() if g.since or (not since and g.live)), key=order)


def unnamed_operations(sites: list[SiteLive], stacks: StackSource, sym: Symbolizer,
                       mods: ProcessModules) -> dict[str, Totals]:
    """The operations the kernel counted per site for objects it could not name (a
    reported process's, SiteMaps.take_sites), per type name read from the files."""
    out: dict[str, Totals] = {}
    for site in sites:
        if site.type_name or not any(site.ops):
            continue
        symbolize_stack(site.stack, stacks, sym, mods)  # teaches the biases the name needs
        add_totals(out, _type_name("", site.name_ptr, sym, mods), site.ops)
    return out


def group_columns(objs: ObjectColumns, stacks: StackSource, sym: Symbolizer, now_ns: int,
                  mods: ProcessModules | None = None) -> list[LeakGroup]:
    """group_leaks() for objects drained as columns (no history): rows are grouped by
    (type, allocation stack) first, each distinct stack symbolized once, and no object
    is built until an output asks for it."""
    mods = mods or ProcessModules()
    groups: dict[tuple[object, ...], tuple[LeakGroup, list[int]]] = {}
    for (type_id, name_ptr, *ref), idx in _rows_by_key(objs).items():
        stack = StackRef(*ref)
        frames, truncated = shown_stack(stack, stacks, sym, mods)
        known = objs.type_names.get(type_id, "") if type_id else ""
        unwind = stack_unwind(stack, stacks)
        group = LeakGroup(_type_name(known, name_ptr, sym, mods), frames,
                          stack_truncated=truncated or unwind.truncated_at is not None,
                          unwind=unwind)
        groups.setdefault(group.key(), (group, []))[1].extend(idx)
    for group, idx in groups.values():
        group.objects = LeakedObjects(objs, idx, now_ns)  # type: ignore[assignment]
    return sorted((g for g, _ in groups.values()), key=LeakGroup.order)


def _rows_by_key(objs: ObjectColumns) -> dict[tuple[int, ...], list[int]]:
    """Row numbers by (type id, type name pointer, stack id, caller)."""
    c = objs.columns
    keys = zip(c["type_id"], c["name_ptr"], c["stack_id"], c["caller_ip"], strict=True)
    distinct = set(keys)
    if len(distinct) == 1:  # the common case: no loop over the rows at all
        return {distinct.pop(): list(range(len(objs)))}
    rows: defaultdict[tuple[int, ...], list[int]] = defaultdict(list)
    keys = zip(c["type_id"], c["name_ptr"], c["stack_id"], c["caller_ip"], strict=True)
    for i, key in enumerate(keys):
        rows[key].append(i)
    return rows


class LeakedObjects(Sequence[LeakedObject]):
    """A group's objects, read from the drained columns when asked for: the text
    report shows a few, the JSON streams them all without a LeakedObject each."""

    without_ownership = True  # held_by/cycle come with --history, never drained this way

    def __init__(self, objs: ObjectColumns, rows: list[int], now_ns: int) -> None:
        self._c, self._rows, self._now = objs.columns, rows, now_ns
        self._sorted = False  # by address: done when all are asked for, not for a few

    def __len__(self) -> int:
        return len(self._rows)

    def _ordered(self, i: slice) -> list[int]:
        addr = self._c["addr"].__getitem__
        if not self._sorted:
            start, stop, step = i.indices(len(self._rows))
            if start == 0 and step == 1 and stop <= 64:  # the text report's first few
                return heapq.nsmallest(stop, self._rows, key=addr)
            self._rows.sort(key=addr)
            self._sorted = True
        return self._rows[i]

    @overload
    def __getitem__(self, i: int) -> LeakedObject: ...
    @overload
    def __getitem__(self, i: slice) -> list[LeakedObject]: ...

    def __getitem__(self, i: int | slice) -> LeakedObject | list[LeakedObject]:
        if isinstance(i, slice):
            return [self._object(r) for r in self._ordered(i)]
        return self._object(self._ordered(slice(i, i + 1 if i != -1 else None))[0])

    def _object(self, r: int) -> LeakedObject:
        c = self._c
        return LeakedObject(c["addr"][r], c["count"][r], c["gets"][r], c["puts"][r],
                            max(0, self._now - c["init_ns"][r]))

    def counts(self) -> list[int]:
        """The distinct final counts, sorted."""
        count = self._c["count"]
        if len(self._rows) == len(count):
            return sorted(set(count))
        return sorted(set(map(count.__getitem__, self._rows)))

    def sums(self) -> tuple[int, int]:
        """(sum of the counts, sum of the ages in ns) of these objects, without building
        one (a pprof profile's references and age)."""
        c, rows, now = self._c, self._rows, self._now
        if len(rows) == len(c["count"]):
            counts, inits = c["count"], c["init_ns"]
        else:
            counts, inits = (array(c[name].typecode, map(c[name].__getitem__, rows))
                             for name in ("count", "init_ns"))
        if not inits or max(inits) <= now:
            return sum(counts), len(inits) * now - sum(inits)
        return sum(counts), sum(max(0, now - i) for i in inits)

    def json_lines(self, start: int, stop: int) -> list[str]:
        """instance_json() of rows start..stop-1 as JSON text (the schema's field order)."""
        c, now = self._c, self._now
        addr, count, gets, puts, init = (c["addr"], c["count"], c["gets"], c["puts"],
                                         c["init_ns"])
        return [f'{{"address": "0x{addr[r]:x}", "count": {count[r]}, "gets": {gets[r]}, '
                f'"puts": {puts[r]}, "age_ns": {max(0, now - init[r])}}}'
                for r in self._ordered(slice(start, stop))]


def _op_frames(ref: StackRef, stacks: StackSource, sym: Symbolizer, mods: ProcessModules,
               stubs: frozenset[str]) -> tuple[Frame, ...]:
    """An operation's path: the probed function dropped, after the frames tail calls
    removed are back (a helper that jumped to the probed function is above its caller),
    with the functions inlined at each frame."""
    if ref not in mods.paths:
        frames = with_tail_calls(symbolize_stack(ref, stacks, sym, mods)[0], sym)
        if frames and frames[0].function.split(".")[0] in stubs:
            frames = frames[1:]
        mods.paths[ref] = sym.expand_inlined(frames)
    return mods.paths[ref]


def _history(rec: ObjectRecord, stacks: StackSource, sym: Symbolizer, mods: ProcessModules,
             ctx: HistoryContext | None) -> tuple[tuple[HistoryStep, ...], list[PathOp]]:
    if rec.history is None or ctx is None:
        return (), []
    stubs = ctx.stub_names
    steps = tuple(HistoryStep(e.op.name.lower(), e.count_after,
                              _op_frames(e.where, stacks, sym, mods, stubs),
                              max(0, e.ts - rec.init_ns), stack_unwind(e.where, stacks))
                  for e in rec.history.events)
    ops = [PathOp(s.op, _op_frames(s.where, stacks, sym, mods, stubs), s.count,
                  s.first_ns, s.last_ns) for s in rec.history.sites]
    return steps, ops


def _evidence(rec: ObjectRecord, type_name: str, ops: list[PathOp]) -> Evidence:
    assert rec.history is not None
    unwalked = sum(s.count for s in rec.history.sites if s.where.stack_id == 0)
    gap = evidence_gap(rec.gets, rec.puts, ops, rec.history.site_overflow, unwalked)
    return Evidence(rec.addr, type_name, rec.init_ns, ops, gap)


SiteKey = tuple[str, int, Role, StackRef]  # as the kernel counts: type, name pointer, op, path


def _leaked_sites(records: list[ObjectRecord]) -> dict[SiteKey, int]:
    """(type name, name pointer, op, path) -> operations of the drained objects themselves."""
    out: dict[SiteKey, int] = {}
    for rec in records:
        for site in rec.history.sites if rec.history else ():
            key = (rec.type_name, rec.name_ptr, site.op, site.where)
            out[key] = out.get(key, 0) + site.count
    return out


def _released_types(stacks: StackSource, sym: Symbolizer, mods: ProcessModules,
                    ctx: HistoryContext) -> list[str]:
    """The type each released row is shown as, named as leaked objects are: objects of
    the stub API share one kernel type, and only the name pointer tells a dso from a map.
    A pointer's path is symbolized first: it teaches the biases the name may need."""
    names: dict[tuple[str, int], str] = {}
    out = []
    for r in ctx.released:
        key = (r.type_name, r.name_ptr)
        if key not in names:
            if r.name_ptr and not r.type_name:
                symbolize_stack(r.site.where, stacks, sym, mods)
            names[key] = _type_name(r.type_name, r.name_ptr, sym, mods)
        out.append(names[key])
    return out


def _released_paths(type_name: str, shown: list[str], stacks: StackSource, sym: Symbolizer,
                    mods: ProcessModules, ctx: HistoryContext,
                    leaked: dict[SiteKey, int]) -> list[PathOp]:
    """The baseline: the kernel counts every object's operations at each path;
    minus the leaked objects' own, what remains is what released objects of the
    type shown as `type_name` (`shown`: each released row's) did."""
    out = []
    for r, name in zip(ctx.released, shown, strict=True):
        if name != type_name:
            continue
        count = r.site.count - leaked.get((r.type_name, r.name_ptr, r.site.op, r.site.where), 0)
        if count > 0:
            out.append(PathOp(r.site.op, _op_frames(r.site.where, stacks, sym, mods,
                                                    ctx.stub_names), count))
    return out


def operation_paths(stacks: StackSource, sym: Symbolizer, mods: ProcessModules,
                    ctx: HistoryContext) -> dict[str, list[PathOp]]:
    """Every type's operations per path, leaked and released objects alike, as the
    kernel counted them: what a later run of the same workload is compared with
    (analysis.regression), so it is kept even when nothing leaked."""
    out: dict[str, list[PathOp]] = {}
    for r, name in zip(ctx.released, _released_types(stacks, sym, mods, ctx), strict=True):
        if r.site.op == Role.DELETE:  # a delete adds or drops no reference
            continue
        # with the functions inlined at each frame: -O2 folds a static helper (or the
        # get/put itself) into its caller, and a change is the helper's
        frames = _op_frames(r.site.where, stacks, sym, mods, ctx.stub_names)
        out.setdefault(name, []).append(PathOp(r.site.op, frames, r.site.count))
    return out


def _alloc_ref(rec: ObjectRecord) -> StackRef:
    return StackRef(rec.stack_id, rec.caller_ip)


def anomaly_findings(records: list[AnomalyRecord], stacks: StackSource, sym: Symbolizer,
                     mods: ProcessModules | None = None) -> list[AnomalyFinding]:
    """Symbolized anomalies; repeats of one kind at one stack are folded with a count."""
    mods = mods or ProcessModules()
    found: dict[AnomalyKey, AnomalyFinding] = {}
    for rec in records:
        frames, _ = shown_stack(rec.where, stacks, sym, mods)
        alloc = shown_stack(rec.alloc, stacks, sym, mods)[0] if rec.alloc else ()
        type_name = _type_name(rec.type_name, rec.name_ptr, sym, mods)
        finding = AnomalyFinding(rec.anomaly.name.lower().replace("_", "-"), type_name,
                                 rec.addr, rec.count_before, frames, alloc,
                                 unwind=stack_unwind(rec.where, stacks),
                                 alloc_unwind=stack_unwind(rec.alloc, stacks) if rec.alloc
                                 else StackUnwind())
        finding = found.setdefault(finding.key(), finding)
        finding.occurrences += 1
    return sorted(found.values(), key=lambda f: (f.separate, -f.occurrences, f.kind))


def _type_name(known: str, name_ptr: int, sym: Symbolizer, mods: ProcessModules) -> str:
    if known:
        return known
    if name_ptr:
        return sym.read_string(name_ptr, mods.biases) or f"<type name at 0x{name_ptr:x}>"
    return "<unnamed>"


def symbolize_stack(ref: StackRef, stacks: StackSource, sym: Symbolizer, mods: ProcessModules
                    ) -> tuple[tuple[Frame, ...], bool]:
    """Symbolized stack, with the caller restored when the walk skipped it: the
    frames the stack holds (shown_stack adds the functions inlined at them)."""
    if ref not in mods.stacks:
        mods.stacks[ref] = _symbolize_stack(ref, stacks, sym, mods)
    return mods.stacks[ref]


def shown_stack(ref: StackRef, stacks: StackSource, sym: Symbolizer, mods: ProcessModules
                ) -> tuple[tuple[Frame, ...], bool]:
    """symbolize_stack with the functions inlined at each frame: what a report shows."""
    frames, truncated = symbolize_stack(ref, stacks, sym, mods)
    return sym.expand_inlined(frames), truncated


def _symbolize_stack(ref: StackRef, stacks: StackSource, sym: Symbolizer,
                     mods: ProcessModules) -> tuple[tuple[Frame, ...], bool]:
    rec = stacks.record(ref.stack_id)
    raw_frames = rec.frames if rec else ()
    raw_ips = rec.ips if rec else ()
    placed = sym.place_frames(raw_frames)
    mods.biases.update(sym.biases(placed, raw_ips))
    for i, frame in enumerate(raw_frames):
        if placed[i] is None and frame.build_id is None and frame.file is None:
            placed[i] = sym.place_raw(frame.offset, mods.biases)
    if placed and placed[-1] is None and raw_frames[-1].build_id:
        placed, raw_frames = placed[:-1], raw_frames[:-1]  # bogus trailing frame (ip 0)
    for path in {p[0] for p in placed if p}:
        sym.prefetch_lines(path, [p[1] - (i > 0) for i, p in enumerate(placed) if p])
    frames = [_frame(sym, mods, p, None if f.build_id else f.offset, _describe_raw(f), i > 0)
              for i, (p, f) in enumerate(zip(placed, raw_frames, strict=True))]
    sym.as_entry_probe(placed[0] if placed else None, frames)
    if ref.caller_ip and not (len(raw_ips) > 1 and raw_ips[1] == ref.caller_ip):
        caller = _frame(sym, mods, sym.place_raw(ref.caller_ip, mods.biases), ref.caller_ip,
                        f"ip 0x{ref.caller_ip:x}", True)
        frames.insert(1 if frames else 0, caller)
    truncated = not frames or not _ends_in_start(frames)
    return tuple(frames), truncated


def stack_unwind(ref: StackRef, stacks: StackSource) -> StackUnwind:
    """How the kernel obtained the stack (StackUnwind() when none was recorded)."""
    rec = stacks.record(ref.stack_id)
    if rec is None:
        return StackUnwind("", 0, "no stack recorded (see the losses)")
    method = UNWINDMETHOD_TEXT.get(rec.method, "")
    if rec.truncated == Truncation.NONE:
        return StackUnwind(method)
    return StackUnwind(method, rec.truncated_at, TRUNCATION_TEXT[rec.truncated])


def _frame(sym: Symbolizer, mods: ProcessModules, placed: tuple[str, int] | None,
           ip: int | None, raw: str, return_address: bool) -> Frame:
    """A frame in a module, else in JIT code the perf map names, else raw."""
    if placed is None and ip is not None:
        jit = sym.jit_frame(mods.perf_map, ip, raw)
        if jit is not None:
            return jit
    return sym.frame(placed, raw, return_address)


def _describe_raw(frame: RawFrame) -> str:
    if frame.build_id:
        return f"build-id {frame.build_id[:16]}.. +0x{frame.offset:x}"
    if frame.file:
        return f"file dev 0x{frame.file[0]:x} inode {frame.file[1]} +0x{frame.offset:x}"
    return f"ip 0x{frame.offset:x}"


def _ends_in_start(frames: list[Frame]) -> bool:
    """A walk that reaches main, a thread start or the C library got to the bottom."""
    names = {f.function for f in frames}
    if names & {"main", "_start", "__libc_start_main", "__libc_start_call_main",
                "start_thread", "clone3", "__clone3", "clone"}:
        return True
    return frames[-1].module.rsplit("/", 1)[-1].startswith(("libc.so", "libc-"))
