"""An indirectly lost object names the object it is lost with, as the report lists it
(analysis/kinds.py; issue 54, item 6): a GObject starts after its private data,
inside its block, so the block's start is no object's address."""

from __future__ import annotations

import numpy as np

from refcntd.analysis.kinds import apply_kinds
from refcntd.analysis.model import LeakedObject, LeakGroup
from refcntd.reach import glibc, graph
from refcntd.reach.roots import Root
from refcntd.reach.scan import ReachScan

# blocks: a lost GObject after 0x20 bytes of private data; a plain lost block; a block
# lost with the first; one lost with the plain block
STARTS = [0x1000, 0x2000, 0x3000, 0x4000]
STATES = [graph.UNREACHED, graph.UNREACHED, graph.INDIRECT, graph.INDIRECT]
LEADERS = [-1, -1, 0, 1]


def scan() -> ReachScan:
    n = len(STARTS)
    return ReachScan(1, heap=glibc.Heap(np.array(STARTS, np.uint64),
                                       np.array([s + 0x100 for s in STARTS], np.uint64)),
                     kinds=graph.Kinds(np.array(STATES, np.int8), np.full(n, -1),
                                       np.zeros(n, np.uint64), np.array(LEADERS)),
                     roots=[Root(0, 0x100, "mapping", "0x0-0x100")])


def obj(address: int) -> LeakedObject:
    return LeakedObject(address, 1, 0, 0, 0)


def test_lost_with_names_the_object_inside_the_block():
    groups = [LeakGroup("JsonParser", (), [obj(0x1020)]),
              LeakGroup("JsonNode", (), [obj(0x3000), obj(0x4000)])]
    roots = {o.address: o.root for g in apply_kinds(groups, scan()) for o in g.objects}
    assert roots[0x3000] == "lost with 0x1020 (JsonParser)"
    assert roots[0x4000] == ("lost with the malloc block 0x2000 (no traced object in it, "
                             "itself lost)")
    assert roots[0x1020] == ""
