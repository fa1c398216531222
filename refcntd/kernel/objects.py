"""What a traced process leaves in the kernel: its live objects (objs), their
history (history, hist_paths), the sites where its released objects were used
(released_sites), its counters (proc_stats) and its stacks (stack_store)."""

from __future__ import annotations

import ctypes
import json
import os
from array import array
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from refcntd.kernel import abi, bpfsys, decode
from refcntd.kernel import columns as objcols
from refcntd.kernel.abi import Role, Stat
from refcntd.kernel.columns import ColumnBuilder, LiveSite, ObjectColumns
from refcntd.kernel.drainahead import Ahead, Pair, rows_by_process
from refcntd.kernel.maps import BackgroundDelete, delete, items, lookup_batches, take
from refcntd.kernel.program import KernelOptions, Program
from refcntd.kernel.records import (
    HistoryRecord,
    ObjectRecord,
    ReleasedSite,
    SiteCount,
    StackRecord,
    StackRef,
)

K = TypeVar("K")  # what one walk of the object map groups its rows by


class BpfObjects:
    """Objects, histories, process counters and stacks, read and removed per process."""

    def __init__(self, program: Program, opts: KernelOptions,
                 names: Callable[[], dict[int, str]], pending: BackgroundDelete) -> None:
        """`names()`: every type name known (the type table's); `pending`: the delete of
        drained objects still running, which every walk of the objects waits for."""
        self.program, self.opts = program, opts
        self._names, self._pending = names, pending
        self.stacks_freed_early = 0  # counted in the report: never silent
        self._objs_ahead = Ahead[ObjectColumns]()
        self._owners_ahead = Ahead[list[abi.ProcStack]]()

    def expect_exit(self, tgid: int, gen: int) -> None:
        """A process whose exit was seen: its report will drain its objects as columns
        and free its stacks; one walk of each map then serves every process waiting
        (drainahead.py)."""
        self._objs_ahead.expect((tgid, gen))
        self._owners_ahead.expect((tgid, gen))

    def drain(self, tgid: int, gen: int | None) -> list[ObjectRecord]:
        """Read and remove the objects of one process (gen None: whatever gen)."""
        self._pending.wait()
        objs = self.program["objs"]
        names = self._names()
        picked = [(k, v) for k, v in items(objs)
                  if k.tgid == tgid and (gen is None or v.gen == gen)]
        delete(objs, [k for k, _ in picked])
        history = self._history([k for k, _ in picked], tgid)
        return [decode.decode_object(k, v, names, history.get(k.addr)) for k, v in picked]

    def drain_columns(self, tgid: int, gen: int | None) -> ObjectColumns:
        """drain() as columns, for a process without history: the map is read BATCH entries
        at a time, each batch decoded by C loops; only the process's keys are deleted."""
        if gen is not None and (ahead := self._drain_ahead((tgid, gen))) is not None:
            return ahead
        builders = self._take_rows(
            lambda tgids, gens, n: {tgid: _rows_of(tgids, gens, tgid, gen, n)})
        return ObjectColumns(tgid, _columns(builders, tgid), self._names())

    def _drain_ahead(self, pair: Pair) -> ObjectColumns | None:
        """`pair`'s columns from a walk for every exited process waiting; None when it
        waits alone (or was not announced by expect_exit)."""
        if (ready := self._objs_ahead.take(pair)) is not None:
            return ready
        wanted = self._objs_ahead.batch(pair)
        if not wanted:
            return None
        builders = self._take_rows(
            lambda tgids, gens, n: rows_by_process(tgids, gens, wanted))
        names = self._names()
        found = {p: ObjectColumns(p[0], _columns(builders, p), names) for p in wanted}
        mine = found.pop(pair)
        self._objs_ahead.keep(found)
        return mine

    def _take_rows(self, select: Callable[[memoryview, memoryview, int],
                                          Mapping[K, range | list[int]]]
                   ) -> dict[K, ColumnBuilder]:
        """One walk of the object map: the rows `select` picks from each batch (by tgid
        and gen columns), as columns per key of its choosing; their keys deleted later."""
        self._pending.wait()
        builders: dict[K, ColumnBuilder] = {}
        doomed = bytearray()
        for keys, values, n in lookup_batches(self.program["objs"]):
            tgids = objcols.column(keys, abi.ObjKey, "tgid", n)
            gens = objcols.column(values, abi.ObjVal, "gen", n)
            for key, rows in select(tgids, gens, n).items():
                if not rows:
                    continue
                if (builder := builders.get(key)) is None:
                    builder = builders[key] = ColumnBuilder(abi.ObjKey, abi.ObjVal)
                builder.add(keys, values, n, None if len(rows) == n else list(rows))
                doomed += _key_bytes(keys, rows, n)
        self._delete_later(doomed)
        return builders

    def _delete_later(self, doomed: bytearray) -> None:
        """The kernel takes ~2 us a key: deleted while the report is made."""
        if doomed:
            size = ctypes.sizeof(abi.ObjKey)
            self._pending.start(self.program["objs"],
                                (abi.ObjKey * (len(doomed) // size)).from_buffer(doomed))

    def addresses_of(self, tgid: int, type_ids: frozenset[int]) -> list[tuple[int, int]]:
        """(address, type id) of one process's live objects of these types, left in the map:
        one walk of it, its columns compared in C (the exit scan names their classes
        while the process is held: reach/gtypes.py)."""
        return [(addr, tid) for _, addr, tid, _ in self.live_of_types(type_ids, tgid)]

    def set_aside(self, tgid: int, addresses: list[int]) -> int:
        """Objects of `tgid` its library flags "may be leaked", the flag read in its
        memory at a scan (the process stopped): set aside in the kernel as a probe
        reading the flag does (bpf/refcntd.c on_set_aside), so the report, the note
        and the metrics are the same.  How many were live and are now aside."""
        if not addresses:
            return 0
        self._pending.wait()
        fd = self.program.load_func("on_set_aside", bpfsys.PROG_RAW_TRACEPOINT)
        return sum(bpfsys.run_raw(fd, [tgid, address]) for address in addresses)

    def live_of_types(self, type_ids: frozenset[int], tgid: int | None = None
                      ) -> list[tuple[int, int, int, int]]:
        """(tgid, address, type id, init ns) of the live objects of these types (of one
        process, or of all), left in the map."""
        self._pending.wait()
        out: list[tuple[int, int, int, int]] = []
        wanted = np.array(sorted(type_ids), np.uint32)
        for keys, values, n in lookup_batches(self.program["objs"]):
            k = np.frombuffer(memoryview(keys), np.dtype(abi.ObjKey), n)  # numpy rows
            v = np.frombuffer(memoryview(values), np.dtype(abi.ObjVal), n)
            tgids, types = k["tgid"], v["type_id"]
            rows = np.isin(types, wanted) & ((tgids == tgid) if tgid is not None else True)
            if not rows.any():
                continue
            addrs, inits = k["addr"][rows], v["init_ns"][rows]
            out += zip(tgids[rows].tolist(), addrs.tolist(), types[rows].tolist(),
                       inits.tolist(), strict=True)
        return out

    def live_objects(self) -> list[ObjectRecord]:
        self._pending.wait()
        names = self._names()
        return [decode.decode_object(keys[i], values[i], names)
                for keys, values, n in lookup_batches(self.program["objs"]) for i in range(n)]

    def live_sites(self, now_ns: int, shown: int) -> list[LiveSite]:
        """Every live object, read once (not drained) as columns and counted per process,
        type and allocation stack; only the first `shown` of each site become records."""
        self._pending.wait()
        builder = ColumnBuilder(abi.ObjKey, abi.ObjVal, ("tgid", "addr"))
        for keys, values, n in lookup_batches(self.program["objs"]):
            builder.add(keys, values, n, None)
        return objcols.live_sites(builder.columns, self._names(), now_ns, shown)

    def released_sites(self, tgid: int) -> list[ReleasedSite]:
        """What released objects of `tgid` did where (history only); removed from the map."""
        if self.opts.history is None:
            return []
        names = self._names()
        picked = take(self.program["released_sites"], tgid)
        return [ReleasedSite(names.get(k.type_id, ""), k.name_ptr, SiteCount(
                    Role(k.op), StackRef(k.stack_id, k.caller_ip),
                    int(getattr(v, "value", v))))  # batch reads give ints, items() c_ulongs
                for k, v in picked]

    def take_process_stats(self, tgid: int) -> dict[Stat, int]:
        """The counters of one reported process; removed from the map."""
        picked = take(self.program["proc_stats"], tgid)
        return {Stat(k.stat): int(getattr(v, "value", v)) for k, v in picked
                if k.stat < len(Stat)}

    def prune_process_stats(self, keep: Callable[[int], bool]) -> int:
        """Drop the counters of processes that will never be reported (not traced, or
        gone without a report); `keep(tgid)` says which must stay.  Returns how many."""
        table = self.program["proc_stats"]
        stale = [k for k, _ in items(table) if not keep(k.tgid)]
        delete(table, stale)
        return len(stale)

    # ---- stacks (bpf/stackstore.h) ---------------------------------------------
    def stack_record(self, stack_id: int) -> StackRecord | None:
        """One stored stack; None when none was recorded (counted by the kernel)."""
        if not stack_id:
            return None
        try:
            value = self.program["stack_store"][ctypes.c_uint64(stack_id)]
        except KeyError:  # freed: every entry is owned by one process, so never expected
            self.stacks_freed_early += 1
            return None
        return decode.decode_stack(value)

    def forget_stacks(self, tgid: int, gen: int, refs: Iterable[StackRef]) -> None:
        """Free every stack-store entry a reported process created.

        Each entry is owned by one process generation (proc_stacks); without
        this a long attach fills the store.  `refs` are the stacks its report
        used (all owned by it: the hash covers tgid and gen).
        """
        owned = self._owned_stacks(tgid, gen)
        delete(self.program["proc_stacks"], owned)
        # objects a forked child inherited keep their ancestor's stacks: not its to free
        keys = {r.stack_id for r in refs if self._stack_owner(r.stack_id) in ((tgid, gen), None)}
        keys |= {k.stack_id for k in owned}
        if dump := os.environ.get("REFCNTD_DUMP_STACKS"):
            self._dump_stacks(dump, tgid, sorted(keys))
        delete(self.program["stack_store"], [ctypes.c_uint64(k) for k in sorted(keys) if k])

    def _owned_stacks(self, tgid: int, gen: int) -> list[abi.ProcStack]:
        """The stack owners' entries of one process generation: from one walk for every
        exited process waiting, when several do (drainahead.py)."""
        pair = (tgid, gen)
        if (ready := self._owners_ahead.take(pair)) is not None:
            return ready
        if not (wanted := self._owners_ahead.batch(pair)):
            return [k for k, v in items(self.program["proc_stacks"])
                    if k.tgid == tgid and int(getattr(v, "value", v)) == gen]
        found: dict[Pair, list[abi.ProcStack]] = {p: [] for p in wanted}
        size = ctypes.sizeof(abi.ProcStack)
        for keys, values, n in lookup_batches(self.program["proc_stacks"]):
            tgids = objcols.column(keys, abi.ProcStack, "tgid", n)
            gens = memoryview(values).cast("B")[:n * 4].cast("I")
            for p, rows in rows_by_process(tgids, gens, wanted).items():
                found[p] += [abi.ProcStack.from_buffer_copy(keys, i * size) for i in rows]
        mine = found.pop(pair)
        self._owners_ahead.keep(found)
        return mine

    def _dump_stacks(self, path: str, tgid: int, keys: list[int]) -> None:
        """REFCNTD_DUMP_STACKS=FILE (debugging, benchmarks/stackquality.py): every stack a
        reported process stored, raw, one JSON line each, appended to FILE."""
        lines = []
        for key in keys:
            rec = self.stack_record(key) if key else None
            if rec is not None:
                lines.append(json.dumps({
                    "tgid": tgid, "method": rec.method.name, "truncated": rec.truncated.name,
                    "truncated_at": rec.truncated_at, "ips": list(rec.ips),
                    "frames": [[f.build_id, f.offset, f.file, f.text_relative]
                               for f in rec.frames]}))
        with open(path, "a") as out:
            out.write("".join(line + "\n" for line in lines))

    def _stack_owner(self, stack_id: int) -> tuple[int, int] | None:
        """(tgid, gen) that stored a stack-store entry; None if there is no such entry."""
        try:
            rec = self.program["stack_store"][ctypes.c_uint64(stack_id)]
        except KeyError:
            return None
        return int(rec.tgid), int(rec.gen)

    # ---- history (HISTORY) -------------------------------------------------------
    def _history(self, keys: list[abi.ObjKey], tgid: int) -> dict[int, HistoryRecord]:
        """History of each drained object with its exact per-path counts; removed from
        the maps (the process's leftover path counts of released objects too)."""
        if self.opts.history is None:
            return {}
        table, values = self.program["history"], {}
        for key in keys:
            value = table.get(key)
            if value is not None:
                values[key.addr] = value
        delete(table, [k for k in keys if k.addr in values])
        paths = self._drain_paths(tgid)
        return {addr: decode.decode_history(v, self.opts.history_depth,
                                            paths.get((addr, v.serial), ()))
                for addr, v in values.items()}

    def _drain_paths(self, tgid: int) -> dict[tuple[int, int], tuple[SiteCount, ...]]:
        """Per (address, serial): the exact path counts of `tgid`'s objects."""
        picked = take(self.program["hist_paths"], tgid)
        out: dict[tuple[int, int], list[SiteCount]] = {}
        for k, v in picked:
            out.setdefault((k.addr, k.serial), []).append(SiteCount(
                Role(k.op), StackRef(k.stack_id, k.caller_ip), v.count, v.first_ns, v.last_ns))
        return {key: tuple(sites) for key, sites in out.items()}


def _rows_of(tgids: memoryview, gens: memoryview, tgid: int, gen: int | None, n: int
             ) -> range | list[int]:
    """Rows of one process (and generation); counted in C when all rows are its own."""
    if tgids.tolist().count(tgid) == n and (gen is None or gens.tolist().count(gen) == n):
        return range(n)
    return [i for i in range(n) if tgids[i] == tgid and (gen is None or gens[i] == gen)]


def _columns(builders: dict[K, ColumnBuilder], key: K) -> dict[str, array[int]]:
    """The columns a walk built for `key`, empty when it had no rows."""
    return (builders.get(key) or ColumnBuilder(abi.ObjKey, abi.ObjVal)).columns


def _key_bytes(keys: ctypes.Array[abi.ObjKey], rows: range | list[int], n: int) -> bytes:
    """The raw keys of `rows` (0..n-1 in one copy when they are all of the batch)."""
    size, raw = ctypes.sizeof(abi.ObjKey), memoryview(keys).cast("B")
    if len(rows) == n:
        return bytes(raw[:n * size])
    return b"".join(raw[i * size:(i + 1) * size] for i in rows)
