"""session/typekeeper.py's logic against a fake type table (kernel.parts.TypeTable):
when names are pruned, which are kept, and that released totals never go down."""

from __future__ import annotations

from refcntd.kernel.parts import TypeTable
from refcntd.kernel.records import Totals
from refcntd.session.typekeeper import TypeKeeper


class FakeTypeTable:
    """The kernel's type table as dicts: id -> name, id -> released totals."""

    def __init__(self, names: dict[int, str], live: set[int]) -> None:
        self.names, self.live = dict(names), live
        self.totals: dict[int, Totals] = {t: (1, 2, 2, 1) for t in names}
        self.fixed: dict[int, str] = {}

    def set_fixed(self, type_id: int, name: str) -> None:
        self.fixed[type_id] = self.names[type_id] = name

    def count(self) -> int:
        return len(self.names)

    def in_use(self) -> set[int]:
        return set(self.live)

    def prune(self, keep: set[int]) -> dict[str, Totals]:
        gone = [t for t in self.names if t not in keep]
        folded = {self.names[t]: self.totals.pop(t) for t in gone if t in self.totals}
        for t in gone:
            del self.names[t]
        return folded

    def released_totals(self) -> dict[str, Totals]:
        return {self.names[t]: sums for t, sums in self.totals.items()}


def keeper(table: FakeTypeTable, capacity: int = 8) -> TypeKeeper:
    types: TypeTable = table  # what the Protocol promises (`mypy --strict` on this file)
    return TypeKeeper(types, capacity, {"fixed": 99})


def test_nothing_is_pruned_below_half_full() -> None:
    table = FakeTypeTable({1: "a", 2: "b", 3: "c"}, live=set())
    k = keeper(table)
    k.prune()
    assert table.count() == 3 and k.pruned == 0


def test_unused_names_go_the_live_and_fixed_ones_stay() -> None:
    table = FakeTypeTable({i: f"t{i}" for i in range(1, 6)}, live={2})
    k = keeper(table)
    k.set_fixed()
    k.prune()
    assert table.names == {2: "t2", 99: "fixed"} and k.pruned == 4


def test_released_totals_never_go_down_when_names_are_pruned() -> None:
    table = FakeTypeTable({i: f"t{i}" for i in range(1, 6)}, live={2})
    k = keeper(table)
    before = k.released_totals()
    k.prune()
    assert k.released_totals() == before
    table.totals[2] = (2, 4, 4, 2)  # more releases of a kept type: added, not replaced
    assert k.released_totals()["t2"] == (2, 4, 4, 2)
    assert k.released_totals()["t1"] == (1, 2, 2, 1)
