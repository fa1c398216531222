"""`refcntd_live_objects_by_class`: the live objects of the spec's `class:` types
(GObject, GstMiniObject) per class, so that buffers, caps and elements can be told
apart on a dashboard.

Read at scrape from the running processes' memory, without stopping them
(reach/gtypes.py: every word checked; an object changing under the read is not
named and is read again at the next scrape).  A class does not change in an
object's life, so each object is read once: the cache is keyed by process,
address and creation time, and forgets what is no longer live.  Labels stay
bounded: per target and type, the MAX_CLASS_LABELS largest classes keep their
name, the others are OTHER_CLASSES; objects whose class could not be read are
UNREAD.
"""

from __future__ import annotations

import time
from collections import Counter

from refcntd.inputs.spec import ClassSource
from refcntd.reach.gtypes import read_classes
from refcntd.session.tracer import Tracer, type_id

MAX_CLASS_LABELS = 20  # per target and type, the others folded into OTHER_CLASSES
OTHER_CLASSES, UNREAD = "_other", "_unread"
Key = tuple[int, int, int]  # (tgid, address, init ns): one object's life


class ClassCounts:
    """One target's classes, kept between scrapes."""

    def __init__(self) -> None:
        self._known: dict[Key, str] = {}
        self.seconds = 0.0  # the last scrape's share (map walks and memory reads)
        self.read = 0  # objects read at the last scrape (not cached)

    def counts(self, tracers: list[Tracer]) -> dict[tuple[str, str], int]:
        """(type, class) -> live objects, folded to MAX_CLASS_LABELS classes per type."""
        began = time.monotonic()
        found: Counter[tuple[str, str]] = Counter()
        seen: dict[Key, str] = {}
        self.read = 0
        for tracer in tracers:
            sources = tracer.plan.spec.class_sources()
            if sources:
                found.update(self._tracer(tracer, sources, seen))
        self._known = seen
        self.seconds = time.monotonic() - began
        return fold(found)

    def _tracer(self, tracer: Tracer, sources: dict[str, ClassSource], seen: dict[Key, str]
                ) -> Counter[tuple[str, str]]:
        names = {type_id(name): name for name in sources}
        todo: dict[int, dict[int, ClassSource]] = {}
        live = tracer.kernel.objects.live_of_types(frozenset(names))
        for tgid, addr, tid, init_ns in live:
            if (tgid, addr, init_ns) not in self._known:
                todo.setdefault(tgid, {})[addr] = sources[names[tid]]
        read = {tgid: read_classes(tgid, objects).names for tgid, objects in todo.items()}
        self.read += sum(len(o) for o in todo.values())
        out: Counter[tuple[str, str]] = Counter()
        for tgid, addr, tid, init_ns in live:
            key = (tgid, addr, init_ns)
            name = self._known.get(key) or read.get(tgid, {}).get(addr)
            if name:
                seen[key] = name
            out[(names[tid], name or UNREAD)] += 1
        return out


def fold(counts: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """Each type's MAX_CLASS_LABELS - 1 largest classes by name (UNREAD kept apart),
    the rest summed under OTHER_CLASSES."""
    out: dict[tuple[str, str], int] = {}
    for type_name in sorted({t for t, _ in counts}):
        ranked = sorted(((n, c) for (t, c), n in counts.items() if t == type_name),
                        key=lambda nc: (-nc[0], nc[1]))
        named = [nc for nc in ranked if nc[1] != UNREAD]
        room = MAX_CLASS_LABELS - 1 if len(named) > MAX_CLASS_LABELS else len(named)
        for n, cls in named[:room]:
            out[(type_name, cls)] = n
        if named[room:]:
            out[(type_name, OTHER_CLASSES)] = sum(n for n, _ in named[room:])
        if counts.get((type_name, UNREAD)):
            out[(type_name, UNREAD)] = counts[(type_name, UNREAD)]
    return out
