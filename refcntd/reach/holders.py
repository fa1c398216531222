"""Who holds each tracked object at the scan: every word that points to it or into it.

A reference count says how many references an object has; the pointer graph says
where pointers to it are.  Put together they tell the reference leak that a memory
checker cannot see: an object still reachable (so valgrind and LeakSanitizer are
content) whose count is higher than the slots that hold it has a reference nobody
holds, a get whose put was lost (perf 6.1's kernel `dso`, docs/leak-kinds.md).

What counts as a holder, and why (the one place that says it):

- a distinct slot (a word of a global, a heap block, a live stack frame, or a
  register) whose value is the object's address or falls inside the object (up to
  its block's end: GLib puts a GObject's private data before it in one block);
- except a link the object's own memory holds to itself (an interior pointer from its
  own block: a list or tree node pointing back into its own object, as
  INIT_LIST_HEAD and RB_CLEAR_NODE leave them): an object does not keep itself alive
  through its own links.  A pointer from its own block to its start is counted (an
  object may hold a reference to itself on purpose: a pending task), unless it is the
  word at that start itself (perf 6.1's `struct map` begins with its rb_node, which
  RB_CLEAR_NODE points at itself: found by the gdb oracle, benchmarks/holders_oracle.py);
- except a pointer to a node that is cleared: the word it points at holds its own
  address (RB_CLEAR_NODE sets a node's parent to itself; INIT_LIST_HEAD and
  list_del_init set next and prev to it).  A node unlinked that way belongs to no
  container, so a pointer to it left behind elsewhere is stale: perf 6.1's
  `dsos__purge` clears each dso's rb_node and puts the dso, never erasing it from the
  tree, and the libc dso's `rb_right` keeps pointing at the kernel dso's node.

Weak pointers (a cache that does not take a reference) are counted too: nothing in
memory tells them apart, so a reference lost while a weak pointer remains is not
seen; that errs towards silence, never towards a false finding.

What the scan cannot see: the callee-saved registers (rbx, rbp, r12-r15) of a thread
stopped in a system call or mid-code (/proc shows only a system call's arguments; the
thread held at `_exit` has them saved in its exit frames, exitframes.py).  A reference
kept only there looks unheld.  So `judged_unheld` says when a count above the holders
is a finding: the object has no holder at all, or every thread's registers were seen.
Measured on the corpus (benchmarks/corpus.py, GLib's installed tests): failing every
count above its holders gave 13 false findings where there were 4, each a GTask or a
GIO object of a multi-threaded test with exactly one holder fewer than its count and
at least one holder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refcntd.reach.roots import Root, describe_slot
from refcntd.reach.scan import ReachScan

LINK_OWN = "a link of its own memory"
LINK_CLEARED = "points at a cleared node (it points to itself): stale"


@dataclass(frozen=True)
class Slot:
    """One word pointing to a tracked object."""

    where: int  # the word's address; 0 for a register
    value: int  # the pointer (the object's address, or inside it)
    block: int = 0  # a heap block holds it: the block's start (else 0: a root)
    block_end: int = 0
    root: str = ""  # a root holds it: `global cache+0x8 (prog)`, `the stack of thread ...`
    root_kind: str = ""  # Root.what: "module", "stack", "registers", "mapping"
    not_counted: str = ""  # why it holds no reference (LINK_OWN, LINK_CLEARED)

    @property
    def counted(self) -> bool:
        return not self.not_counted


def pointers_to(scan: ReachScan, objects: set[int]) -> dict[int, list[Slot]] | None:
    """Per object address: the slots pointing into it (up to its block's end), each
    once; objects outside every heap block get none.  None: a scan without its edges
    (not finished, or read already) says nothing of holders."""
    edges, heap = scan.edges, scan.heap
    if edges is None:
        return None
    if not objects or not len(heap.starts):
        return {}
    addresses = np.array(sorted(objects), np.uint64)
    block = np.searchsorted(heap.starts, addresses, "right").astype(np.int64) - 1
    inside = (block >= 0) & (addresses < heap.ends[np.maximum(block, 0)])
    addresses, block = addresses[inside], block[inside]
    wanted = np.zeros(len(heap.starts), bool)
    wanted[block] = True
    into = np.flatnonzero(wanted[edges.dst])
    into = into[np.argsort(edges.dst[into], kind="stable")]
    cleared = _cleared_nodes(scan, wanted)
    out: dict[int, list[Slot]] = {}
    dst_sorted = edges.dst[into]
    for address, b in zip(addresses.tolist(), block.tolist(), strict=True):
        lo, hi = np.searchsorted(dst_sorted, [b, b + 1])
        end = int(heap.ends[b])
        slots: dict[tuple[int, int], Slot] = {}
        for i in into[lo:hi].tolist():
            value = int(edges.value[i])
            if not address <= value < end:
                continue
            src, where = int(edges.src[i]), int(edges.where[i])
            key = (src, where if where else value)
            if key not in slots:
                slots[key] = _slot(scan, src, where, value, address, b, cleared)
        out[address] = sorted(slots.values(), key=lambda s: (not s.counted, s.where))
    return out


def _slot(scan: ReachScan, src: int, where: int, value: int, address: int, block: int,
          cleared: set[int]) -> Slot:
    heap = scan.heap
    why = ""
    if where == value:  # a node at the object's start, cleared: it points to itself
        why = LINK_CLEARED
    elif value != address:
        if src == block:
            why = LINK_OWN
        elif value in cleared:
            why = LINK_CLEARED
    if src >= 0:
        return Slot(where, value, int(heap.starts[src]), int(heap.ends[src]), not_counted=why)
    root: Root = scan.roots[-1 - src]
    return Slot(where, value, root=describe_slot(root, where), root_kind=root.what,
                not_counted=why)


def _cleared_nodes(scan: ReachScan, wanted: np.ndarray) -> set[int]:
    """Addresses inside the wanted blocks whose word holds that same address: the
    nodes RB_CLEAR_NODE, INIT_LIST_HEAD or list_del_init left pointing to themselves."""
    edges = scan.edges
    assert edges is not None
    own = (edges.src >= 0) & (edges.where == edges.value)
    own &= wanted[np.maximum(edges.src, 0)]
    return set(edges.where[own].tolist())


def judged_unheld(count: int, holders: int, unseen_threads: int) -> bool:
    """Whether references above the holders are a finding (see the module's docstring):
    none held at all, or none of the process's registers out of sight."""
    return count > holders and (holders == 0 or unseen_threads == 0)
