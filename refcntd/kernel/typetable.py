"""The kernel's table of type names (types: id -> name, interned by the BPF side at
each init) and the totals of released objects per type (totals)."""

from __future__ import annotations

import contextlib
import ctypes

from refcntd.kernel import abi
from refcntd.kernel.maps import BackgroundDelete, cpu_sums, items, lookup_batches
from refcntd.kernel.program import KernelOptions, Program
from refcntd.kernel.records import Totals, add_totals

MAX_PRUNED_NAMES = 1 << 16  # pruned type names remembered (oldest forgotten first)
TYPE_NAME_MAX = abi.TYPE_NAME_LEN - 1  # bytes of a name the kernel keeps (NUL aside)


class BpfTypeTable:
    """Type names in the kernel, and those pruned from it (still named in reports)."""

    def __init__(self, program: Program, opts: KernelOptions, pending: BackgroundDelete
                 ) -> None:
        """`pending`: the delete of drained objects still running (in_use walks them)."""
        self.program, self.opts = program, opts
        self._pending = pending
        self.pruned_names: dict[int, str] = {}  # type names moved out of the kernel's table

    def set_fixed(self, type_id: int, name: str) -> None:
        """A spec's constant type name, under the id type_id() gives it."""
        self.program["types"][ctypes.c_uint32(type_id)] = abi.TypeName(
            name.encode()[:TYPE_NAME_MAX])

    def name_of(self, type_id: int) -> str:
        if not type_id:
            return ""
        value = self.program["types"].get(ctypes.c_uint32(type_id))
        if value is None:
            return self.pruned_names.get(type_id, "")
        return str(value.name.decode(errors="replace"))

    def names(self) -> dict[int, str]:
        """Every type name known: in the kernel's table, or pruned from it."""
        return {**self.pruned_names, **self._kernel_names()}

    def count(self) -> int:
        return sum(n for _, _, n in lookup_batches(self.program["types"]))

    def in_use(self) -> set[int]:
        """Type ids of live objects (per site with SITES: no walk of the objects)."""
        if self.opts.sites:
            return {keys[i].type_id for keys, values, n in
                    lookup_batches(self.program["alloc_sites"]) for i in range(n)
                    if values[i].live > 0}
        self._pending.wait()
        return {values[i].type_id for _, values, n in lookup_batches(self.program["objs"])
                for i in range(n)}

    def prune(self, keep: set[int]) -> dict[str, Totals]:
        """Remove type names (and their released totals) not in `keep` (the live
        objects' types), so the fixed-size table keeps room for new types; returns the
        totals removed, per name, for the caller to keep counting.  A type in use again
        later is interned again at its next init."""
        names, totals = self._kernel_names(), self.program["totals"]
        gone = [t for t in names if t not in keep]
        for type_id in gone:  # objects released before may still be named (anomalies)
            self.pruned_names[type_id] = names[type_id]
        while len(self.pruned_names) > MAX_PRUNED_NAMES:
            del self.pruned_names[next(iter(self.pruned_names))]
        folded: dict[str, Totals] = {}
        for type_id in gone:
            key = totals.Key(type_id)
            per_cpu = totals.get(key)
            if per_cpu is not None:
                add_totals(folded, names[type_id], cpu_sums(per_cpu))
                with contextlib.suppress(KeyError):
                    del totals[key]
            with contextlib.suppress(KeyError):
                del self.program["types"][self.program["types"].Key(type_id)]
        return folded

    def released_totals(self) -> dict[str, Totals]:
        """Per type name: (inits, gets, puts, releases) of objects released so far."""
        names = self.names()
        out: dict[str, Totals] = {}
        for key, per_cpu in items(self.program["totals"]):  # batch reads: see Kernel.stats
            add_totals(out, names.get(key.value, "") or "unknown", cpu_sums(per_cpu))
        return out

    def _kernel_names(self) -> dict[int, str]:
        return {k.value: v.name.decode(errors="replace")
                for k, v in items(self.program["types"])}
