"""A saved run's plain instance arrays read as columns, not as a dict and an object each.

`json.loads` of a run with 1 000 000 leaked objects builds a million dicts, and
turning them into LeakedObjects took load_run 3.5 s on an idle 2-vCPU VM (8.2 s
loaded, 520 MiB) before `report --format pprof` could sum three numbers per group.
Each `"instances": [...]` array that holds only the five plain fields that
`reportjson` writes for an object without history is cut out of the text; the
rest (bounded by groups) is parsed as usual, and the array is parsed a few MiB at a
time into typed columns read by analysis.leaks.LeakedObjects, the sequence a live
run's objects drained as columns already are, so every format renders them alike.

An array is cut only when it reads back exactly as the per-object loader would
read it: keys exactly address/count/gets/puts/age_ns, integer values that fit 64
bits, ages not negative, addresses in order (the writer sorts them; LeakedObjects
sorts when all are asked for).  Anything else (history, held_by, a hand-edited
file) keeps its array in the text for the per-object loader.
"""

from __future__ import annotations

import json
import operator
import re
import uuid
from array import array
from collections.abc import Iterator, Sequence
from itertools import islice, repeat

from refcntd.analysis.leaks import LeakedObjects
from refcntd.analysis.model import LeakedObject
from refcntd.kernel.columns import ObjectColumns

FIELDS = ("address", "count", "gets", "puts", "age_ns")
_START = re.compile(r'"instances": \[')
_CHUNK_CHARS = 1 << 22  # ~4 MiB of text (~50 000 objects) parsed at a time
_BOOLEANS = ("true", "false")  # array("q") takes them as 1 and 0; floats and null it refuses


class SavedObjects(LeakedObjects):
    """A saved group's objects as columns; ages stored as init_ns = -age with now 0, so
    LeakedObjects' max(0, now - init) gives each saved age back unchanged."""

    def __init__(self, columns: dict[str, array[int]]) -> None:
        super().__init__(ObjectColumns(0, columns), list(range(len(columns["addr"]))), 0)
        self.without_ownership = True  # CutRun.finish() says otherwise when needed


class CutRun:
    """The run's text with its plain instance arrays replaced by unique tokens."""

    def __init__(self, text: str) -> None:
        token = f"@@refcntd-instances-{uuid.uuid4().hex}-"
        pieces, pos = [], 0
        self.arrays: dict[str, SavedObjects] = {}
        for match in _START.finditer(text):
            start = match.end() - 1
            end = text.find("]", start)
            # a key's opening quote is never escaped: a backslash before it is a string's
            if end < 0 or text[match.start() - 1] == "\\":
                continue
            columns = read_columns(text, start + 1, end)
            if columns is None:
                continue
            name = f"{token}{len(self.arrays)}"
            self.arrays[name] = SavedObjects(columns)
            pieces += [text[pos:start], f'"{name}"']
            pos = end + 1
        self.skeleton = "".join([*pieces, text[pos:]]) if self.arrays else text
        self._taken: list[SavedObjects] = []
        self._listed = False  # a group's instances left to the per-object loader

    def objects(self, items: object) -> Sequence[LeakedObject] | None:
        """The cut array `items` names (taken once); None for a list left in the text."""
        if isinstance(items, str):
            self._taken.append(self.arrays.pop(items))  # KeyError: not ours, malformed
            return self._taken[-1]
        self._listed = self._listed or bool(items)
        return None

    def finish(self) -> bool:
        """Whether every cut array went to a group.  Objects kept as a list may hold
        (held_by) cut ones: those are then searched as owners like a list's."""
        for objects in self._taken:
            objects.without_ownership = not self._listed
        return not self.arrays


def read_columns(text: str, lo: int, hi: int) -> dict[str, array[int]] | None:
    """text[lo:hi], the inside of one instance array, as columns (addr, count, gets, puts,
    init_ns); None unless every element is a plain object that reads back the same."""
    if text.find("[", lo, hi) >= 0 or any(text.find(w, lo, hi) >= 0 for w in _BOOLEANS):
        return None
    addr, count, gets, puts, age = (array("Q"), *(array("q") for _ in range(4)))
    try:
        for a, b in _chunks(text, lo, hi):
            rows = json.loads(f"[{text[a:b]}]")
            if sum(map(len, rows)) != len(FIELDS) * len(rows):
                return None
            addr.extend(map(int, map(operator.itemgetter("address"), rows), repeat(16)))
            for column, name in ((count, "count"), (gets, "gets"), (puts, "puts"),
                                 (age, "age_ns")):
                column.extend(map(operator.itemgetter(name), rows))
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
        return None
    if min(age, default=0) < 0 or not all(map(operator.le, addr, islice(addr, 1, None))):
        return None
    return {"addr": addr, "count": count, "gets": gets, "puts": puts,
            "init_ns": array("q", map(operator.neg, age))}


def _chunks(text: str, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """Spans of whole elements, cut after a `}` that a `,{` follows (the writer's join);
    a cut inside a string leaves an unterminated string, which json.loads refuses."""
    while lo < hi:
        cut = text.find("},{", min(lo + _CHUNK_CHARS, hi), hi)
        stop = hi if cut < 0 else cut + 1
        yield lo, stop
        lo = stop + 1
