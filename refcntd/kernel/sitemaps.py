"""Live objects per allocation site (alloc_sites), since a checkpoint (since,
checkpoint) and per creation time (age_bins): what serve and attach read instead
of walking every object (SITES)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from refcntd.kernel import decode
from refcntd.kernel.maps import delete, items, lookup_batches
from refcntd.kernel.program import KernelOptions, Program
from refcntd.kernel.records import AgeBin, SiteLive

AGE_SUM_SHIFT = 10  # since.age_sum is kept in units of 1024 ns (bpf/refcntd.c)


class BpfSiteMaps:
    """Per-site and per-age counts: O(sites) and O(types x bins), never O(objects)."""

    def __init__(self, program: Program, opts: KernelOptions,
                 names: Callable[[], dict[int, str]]) -> None:
        """`names()`: every type name known (the type table's)."""
        self.program, self.opts, self._names = program, opts, names
        self.checkpoint_ns = 0  # the checkpoint the kernel counts "since" from

    def set_checkpoint(self, at_ns: int) -> None:
        """Objects created from `at_ns` (CLOCK_MONOTONIC) on count as "since" per site;
        the counts of the previous checkpoint are dropped."""
        self.program["checkpoint"][ctypes.c_int(0)] = ctypes.c_uint64(at_ns)
        self.checkpoint_ns = at_ns
        since = self.program["since"]
        delete(since, [k for k, _ in items(since) if k.cp != at_ns])

    def site_lives(self, unnamed: bool = False) -> list[SiteLive]:
        """Every allocation site with live objects, per process: O(sites); `unnamed`:
        also the sites of objects whose type the kernel could not name, live or not
        (their operations are counted there, not per type)."""
        names, cp = self._names(), self.checkpoint_ns
        since: dict[bytes, tuple[int, int]] = {}
        if cp:
            for keys, values, n in lookup_batches(self.program["since"]):
                for i in range(n):
                    if keys[i].cp == cp and values[i].live > 0:
                        since[bytes(keys[i].site)] = (values[i].live, values[i].age_sum)
        out = []
        for keys, values, n in lookup_batches(self.program["alloc_sites"]):
            for i in range(n):
                k, v = keys[i], values[i]
                live, age_sum = since.get(bytes(k), (0, 0))
                if v.live <= 0 and not live and not (unnamed and not k.type_id):
                    continue
                out.append(decode.site_live(k, v, names, live, cp + (
                    age_sum << AGE_SUM_SHIFT) // live if live else 0))
        return out

    def take_sites(self, tgid: int, gen: int | None) -> list[SiteLive]:
        """A reported process's per-site counts, removed with its objects' other traces
        (gen None: whatever gen).  The caller names the unnamed ones' operations."""
        if not self.opts.sites:
            return []
        names = self._names()

        def mine(k: Any) -> bool:
            return bool(k.tgid == tgid and (gen is None or k.gen == gen))
        picked = [(k, v) for k, v in items(self.program["alloc_sites"]) if mine(k)]
        delete(self.program["alloc_sites"], [k for k, _ in picked])
        for name in ("since", "age_bins"):
            table = self.program[name]
            delete(table, [k for k, _ in items(table) if mine(k.site if name == "since" else k)])
        return [decode.site_live(k, v, names, 0, 0) for k, v in picked]

    def age_bins(self, now_ns: int) -> list[AgeBin]:
        """Live objects per process, type and creation time (see age_view); bins no
        longer needed are removed.  O(types x bins), never O(objects)."""
        names, table = self._names(), self.program["age_bins"]
        rows: list[decode.AgeRow] = []
        keys = []
        for batch, values, n in lookup_batches(table):
            for i in range(n):
                k = batch[i]
                rows.append((k.tgid, k.gen, k.type_id, k.name_ptr, k.bin, int(values[i])))
                keys.append(table.Key.from_buffer_copy(k))
        bins, doomed = decode.age_view(rows, now_ns)
        delete(table, [keys[i] for i in doomed])
        return [AgeBin(tgid, names.get(type_id, "") if type_id else "", name_ptr, start, end,
                       count) for (tgid, _gen, type_id, name_ptr), start, end, count in bins]
