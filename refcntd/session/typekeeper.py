"""The kernel's type table over a long run: the spec's constant names set once, the
names no live object uses removed when the table fills (a program can name more
types over its life than the table holds), their totals kept here so that the
released totals never go down."""

from __future__ import annotations

import threading

from refcntd.kernel.parts import TypeTable
from refcntd.kernel.records import Totals, add_totals

PRUNE_AT = 0.5  # share of the table in use from which unused types are removed


class TypeKeeper:
    """Run prune() on the report worker; released_totals() from any thread."""

    def __init__(self, types: TypeTable, capacity: int, fixed: dict[str, int]) -> None:
        """`capacity`: the table's size (max_types); `fixed`: the spec's constant type
        names and their ids, never removed."""
        self.types, self._capacity, self._fixed = types, capacity, fixed
        self._lock = threading.Lock()  # the pruned totals and the kernel's change together
        self._pruned_totals: dict[str, Totals] = {}
        self.pruned = 0  # type names removed so far

    def set_fixed(self) -> None:
        for name, type_id in self._fixed.items():
            self.types.set_fixed(type_id, name)

    def prune(self) -> None:
        """Remove the names no live object uses once the table is PRUNE_AT full."""
        if self.types.count() < self._capacity * PRUNE_AT:
            return
        keep = self.types.in_use() | set(self._fixed.values())
        with self._lock:
            folded = self.types.prune(keep)
            for name, sums in folded.items():
                add_totals(self._pruned_totals, name, sums)
            self.pruned += len(folded)

    def released_totals(self) -> dict[str, Totals]:
        """Per type name, (inits, gets, puts, releases) of released objects: the kernel's
        totals plus those of the names pruned from its table."""
        with self._lock:
            out = dict(self._pruned_totals)
            for name, sums in self.types.released_totals().items():
                add_totals(out, name, sums)
        return out
