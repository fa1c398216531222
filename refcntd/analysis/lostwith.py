"""What an indirectly lost object is lost with, as the report lists it.

The exit scan (refcntd/reach/) says which definitely lost heap block holds an
indirectly lost one, by the block's start.  A GObject does not start its block:
GLib puts the instance's private data first, in the same allocation, so the
start is no object's address, has no type, and the report lists nothing there.
Here that start becomes the traced object inside the block (its type and its own
address), or, where the block holds no traced object, is said to be a plain one.
"""

from __future__ import annotations

from dataclasses import replace

from refcntd.analysis.model import LeakedObject, LeakGroup
from refcntd.reach.scan import ReachScan

LOST_WITH = "lost with 0x"


def name_leaders(groups: list[LeakGroup], scan: ReachScan) -> list[LeakGroup]:
    """`groups` with each "lost with 0xSTART" root naming the object in that block."""
    if not any(o.root.startswith(LOST_WITH) for g in groups for o in g.objects):
        return groups
    types = {o.address: g.type_name for g in groups for o in g.objects}
    inside: dict[int, int | None] = {}  # block start -> its one traced object (None: more)
    for address, k in scan.kinds_of(types).items():
        inside[k.block] = None if k.block in inside else address
    return [replace(g, objects=[_named(o, inside, types) for o in g.objects])
            if any(o.root.startswith(LOST_WITH) for o in g.objects) else g for g in groups]


def _named(obj: LeakedObject, inside: dict[int, int | None], types: dict[int, str]
           ) -> LeakedObject:
    if not obj.root.startswith(LOST_WITH):
        return obj
    start = int(obj.root.split()[2], 16)
    if start not in inside:
        root = f"lost with the malloc block 0x{start:x} (no traced object in it, itself lost)"
    elif (leader := inside[start]) is None:
        root = f"lost with the malloc block 0x{start:x} (shared by several traced objects)"
    else:
        root = f"lost with 0x{leader:x} ({types[leader]})"
    return replace(obj, root=root)
