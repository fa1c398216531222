"""Leak kinds on a process's leak groups, from its reachability scan (refcntd/reach/).

A group's objects can differ in kind (one cached, the others lost): the group is
split, one group per kind, so that a report, a policy and a baseline see each kind
apart.  Objects the scan gave no kind (not inside a malloc block) keep none, and so
do objects sharing their block with another tracked object (a pool allocator's
slab that the scan did not cut into its chunks: GSlice's are, reach/gslice.py): the
slab is reachable while one of its objects is, which says nothing of the others.
One object inside its block keeps the block's kind: GLib puts a GObject's private
data before it, in the same allocation.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import replace

from refcntd.analysis.model import LeakedObject, LeakGroup, Pointer
from refcntd.binary.structs import StructNames
from refcntd.reach.holders import Slot, judged_unheld, pointers_to
from refcntd.reach.scan import IN_REGISTER, INDIRECTLY, LATE, REACHABLE, ObjectKind, ReachScan
from refcntd.symbolize.symbolizer import Frame

UNHELD = "reference held by nothing"  # still reachable, count above its holders (holders.py)
ORDER = {UNHELD: -1, "definitely lost": 0, INDIRECTLY: 1, IN_REGISTER: 2, REACHABLE: 3, LATE: 4,
         "": 5}
MAX_POINTERS = 8  # pointers kept per object (counted first); `holders` counts them all
MEMBER_FRAMES = 4  # allocation frames whose units may define a holder's struct


def apply_kinds(groups: list[LeakGroup], scan: ReachScan, now_ns: int | None = None
                ) -> list[LeakGroup]:
    """The groups with each object's kind and root, split by kind; a note on `scan` for
    objects that share their block (a pool allocator's slab the scan did not cut).
    `now_ns` (the clock of the objects' ages): objects created after the scan began
    are LATE, whatever their address holds now."""
    if not scan.complete:
        return groups
    objects = {id(g): list(g.objects) for g in groups}  # read once: a lazy sequence (leaks.py)
    late = _late(groups, objects, scan, now_ns)
    kinds = scan.kinds_of(o.address for g in groups for o in objects[id(g)]
                          if o.address not in late)
    # a holder or a "lost with" is named by its class where the scan read it (gtypes.py)
    types = {o.address: scan.classes.get(o.address) or g.type_name
             for g in groups for o in objects[id(g)]}
    per_block = Counter(k.block for k in kinds.values())
    shared = [a for a, k in kinds.items() if per_block[k.block] > 1]
    # block start -> its one traced object (None: several), what "lost with" names
    inside = {k.block: a if per_block[k.block] == 1 else None for a, k in kinds.items()}
    for address in shared:
        del kinds[address]
    if shared:
        scan.notes.append(f"{len(shared)} object(s) sharing a malloc block with another (a "
                          "pool allocator's slab, not cut into its chunks: only glibc "
                          "malloc's and GLib 2.74's GSlice are understood): no kind, every "
                          "one a leak as without --leak-kinds")
    _note_freed(scan, [o.address for g in groups for o in objects[id(g)]
                       if o.address not in kinds and o.address not in late])
    _note_registers(scan, [a for a, k in kinds.items() if k.kind == IN_REGISTER])
    slots = pointers_to(scan, set(kinds))
    scan.drop_edges()
    kinds.update(late)
    with StructNames() as names:
        held = Holders(types, slots, {o.address: g.frames for g in groups
                                      for o in objects[id(g)]}, names, scan.unseen_threads,
                       inside)
        return _split(groups, objects, kinds, held)


def _split(groups: list[LeakGroup], objects: dict[int, list[LeakedObject]],
           kinds: dict[int, ObjectKind], held: Holders) -> list[LeakGroup]:
    """Each group split by its objects' kinds (the holders decide UNHELD)."""
    out = []
    for group in groups:
        parts: dict[str, list[LeakedObject]] = {}
        for obj in objects[id(group)]:
            k = kinds.get(obj.address)
            if k is not None:
                obj = held.apply(obj, k) if k.kind != LATE else replace(obj, kind=LATE)
            parts.setdefault(obj.kind, []).append(obj)
        for kind in sorted(parts, key=ORDER.__getitem__):
            out.append(replace(group, objects=parts[kind], kind=kind, culprits=list(
                group.culprits)))
    return sorted(out, key=LeakGroup.order)


def _late(groups: list[LeakGroup], objects: dict[int, list[LeakedObject]], scan: ReachScan,
          now_ns: int | None) -> dict[int, ObjectKind]:
    """Objects created after the scan began: at exit, by threads that ran on once the
    process was continued, until exit_group ended them (their memory was free or
    another block's at the scan).  No checker sees them: valgrind and LeakSanitizer
    judge the heap at one moment.  A note says how many."""
    if now_ns is None or not scan.taken_ns:
        return {}
    late = {o.address: ObjectKind(LATE) for g in groups for o in objects[id(g)]
            if now_ns - o.age_ns > scan.taken_ns}
    if late:
        scan.notes.append(f"{len(late)} object(s) created after the scan, by threads still "
                          "running once it was over: not judged (no leak checker sees "
                          "them)")
    return late


class Holders:
    """Each object's holders from the scan's slots, named after the tracked object or the
    block holding them, and the kind an unheld reference gives it."""

    def __init__(self, types: dict[int, str], slots: dict[int, list[Slot]] | None,
                 frames: dict[int, tuple[Frame, ...]], names: StructNames,
                 unseen_threads: int = 0, inside: dict[int, int | None] | None = None
                 ) -> None:
        self.types, self.slots, self.frames, self.names = types, slots, frames, names
        self.unseen_threads, self.inside = unseen_threads, inside or {}
        self.addresses = sorted(types)

    def apply(self, obj: LeakedObject, k: ObjectKind) -> LeakedObject:
        if self.slots is None:  # no pointer graph: the kind alone
            return replace(obj, kind=k.kind, root=_root(k, self.types, self.inside))
        found = self.slots.get(obj.address, [])
        holders = sum(1 for s in found if s.counted)
        unheld = judged_unheld(obj.count, holders, self.unseen_threads)
        kind = UNHELD if k.kind == REACHABLE and unheld else k.kind
        pointers = tuple(self.pointer(s, obj.address) for s in found[:MAX_POINTERS])
        return replace(obj, kind=kind, root=_root(k, self.types, self.inside), holders=holders,
                       pointers=pointers)

    def pointer(self, s: Slot, target: int) -> Pointer:
        return Pointer(self.holder(s), s.where, s.value != target, s.counted, s.not_counted)

    def holder(self, s: Slot) -> str:
        """`map 0x55d0..+0x18` (a tracked object), `a 64-byte block 0x..+0x10`, or the
        root's own words (`global dsos+0x8 (perf)`)."""
        if not s.block:
            return s.root
        i = bisect_right(self.addresses, s.where) - 1
        if i < 0 or self.addresses[i] < s.block:  # before its object: GLib's private data
            i += 1
        if i < len(self.addresses) and s.block <= self.addresses[i] < s.block_end:
            owner = self.addresses[i]
            off = s.where - owner
            member = self.member(owner, off) if off >= 0 else None
            return f"{self.types[owner]} 0x{owner:x}" + \
                (f" {member}" if member else f"{'+' if off >= 0 else '-'}0x{abs(off):x}")
        return f"a {s.block_end - s.block}-byte block 0x{s.block:x}+0x{s.where - s.block:x}"

    def member(self, owner: int, offset: int) -> str | None:
        """`.dso`: the member of the owner's struct at `offset`, from the DWARF of the
        modules that allocated it (binary/structs.py)."""
        frames = self.frames.get(owner, ())[:MEMBER_FRAMES]
        for module in dict.fromkeys(f.module for f in frames if f.module):
            vaddrs = [f.vaddr for f in frames if f.module == module]
            found = self.names.member(module, vaddrs, self.types[owner], offset)
            if found:
                return found
        return None


def _note_registers(scan: ReachScan, held: list[int]) -> None:
    """Objects a live scan found lost that a thread's registers may hold (deadframes.py):
    said, by thread, rather than judged."""
    by_thread = Counter(scan.maybe_held[b] for b in scan.block_indices(held))
    for thread, n in sorted(by_thread.items()):
        scan.notes.append(f"{n} object(s) unreached but not judged lost: the registers of "
                          f"thread {thread}, which a live scan cannot read, may hold them (a "
                          "pointer into them lies in the frames it just left)")


def _note_freed(scan: ReachScan, unkinded: list[int]) -> None:
    """Objects whose memory malloc holds as free at the scan: a release refcntd did not
    see (its delete went another way), said rather than judged."""
    freed = scan.freed(unkinded)
    if freed:
        scan.notes.append(f"{len(freed)} object(s) in malloc chunks free at the scan (their "
                          "memory was released, their delete not seen): no kind, a leak as "
                          "without leak kinds")


def _root(k: ObjectKind, types: dict[int, str], inside: dict[int, int | None]) -> str:
    """Where a reachable object is reached from; what an indirectly lost one is lost
    with (the definitely lost block whose pointers hold it: the real pointer graph,
    also without --history), named by the traced object in that block as the report
    lists it: a GObject starts after its private data, inside its block, so the
    block's start is no object's address (issue 54)."""
    if k.lost_with:
        if k.lost_with not in inside:
            return (f"lost with the malloc block 0x{k.lost_with:x} (no traced object in it, "
                    "itself lost)")
        leader = inside[k.lost_with]
        if leader is None:
            return (f"lost with the malloc block 0x{k.lost_with:x} (shared by several traced "
                    "objects)")
        return f"lost with 0x{leader:x} ({types[leader]})"
    return k.root + (" (only through a pointer into it: valgrind's possibly lost)"
                     if k.interior_only else "")
