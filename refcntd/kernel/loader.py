"""Attach bpf/refcntd.c's programs (made by program.py) and read its maps.

Everything it returns is a frozen dataclass from records.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from refcntd.errors import EnvironmentProblem, ProbeError
from refcntd.kernel import abi, bpfsys, cfi, decode, perf_uprobe, progcache, setup
from refcntd.kernel import columns as objcols
from refcntd.kernel.abi import EventKind, Role, Stat
from refcntd.kernel.cfi import CfiTable
from refcntd.kernel.columns import ColumnBuilder, ObjectColumns
from refcntd.kernel.perf_uprobe import MultiRefusal
from refcntd.kernel.program import CHAIN, KernelOptions, Program, compile_program
from refcntd.kernel.records import (
    STAGE_LINK,
    STAGE_MULTI,
    STAGE_OPEN,
    AgeBin,
    AnomalyRecord,
    HistoryRecord,
    LifecycleEvent,
    ObjectRecord,
    ProbeFailure,
    ReleasedSite,
    SiteCount,
    SiteLive,
    StackRecord,
    StackRef,
    Totals,
    add_totals,
)
from refcntd.paths import CACHE_DIR

if TYPE_CHECKING:  # attach's start imports this module: not the binary analysis with it
    from refcntd.binary.plan import ProbeSite


class Kernel:
    """Loaded BPF state and attached probes; a context manager that always detaches.

    Construction touches nothing outside: call kernel.setup.prepare() once first
    (privileges, tracefs, BCC_KERNEL_SOURCE).
    """

    def __init__(self, opts: KernelOptions, sites: list[ProbeSite], program: Program | None = None,
                 multi: bool = True) -> None:
        """`program`: bpf/refcntd.c already compiled for `opts` (compile_program).

        `multi`: attach through BPF_TRACE_UPROBE_MULTI links; False: one perf event per
        site (the programs are then loaded as plain kprobe programs: the kernel links
        a multi-typed program to nothing else).
        """
        self.multi = multi
        self.opts, self.sites = opts, sites
        self.checkpoint_ns = 0  # SITES: the checkpoint the kernel counts "since" from
        self._links: list[int] = []
        self._perf_fds: list[int] = []
        self.multi_links = 0  # how many multi-uprobe links attach_all made
        self.pruned_names: dict[int, str] = {}  # type names moved out of the kernel's table
        self.multi_sites = 0  # how many sites they carry
        self.loader_links = 0  # ld.so's _dl_debug_state call sites, one multi link
        self.multi_refused: list[MultiRefusal] = []  # groups that fell back, and why
        self.failed_probes: list[ProbeFailure] = []
        self.stacks_freed_early = 0  # counted in the report: never silent
        self._tables: set[tuple[int, int]] = set()  # (ino, dev) of files given to BPF
        self._cfi_rows_used = 0
        self.tables_not_loaded: list[str] = []  # cfi_rows full: shown as a note
        self.program = program if program is not None else compile_program(opts, len(sites))
        for attempt in (1, 2):
            try:
                self._load()
                break
            except OSError as err:  # a program the kernel refused, or a tracepoint
                if not self.program.from_cache or attempt == 2:
                    self.program.cleanup()
                    raise EnvironmentProblem(f"the BPF program failed to load: {err}",
                                             "check kernel headers (BCC_KERNEL_SOURCE)") from None
                # A cached program the kernel refused: drop the entry and compile anew.
                progcache.discard(CACHE_DIR, self.program.entry.key)
                self.program.cleanup()
                self.program = compile_program(opts, len(sites), cached=False)

    @property
    def bpf(self) -> Program:
        """The program's maps by name (`kernel.bpf["objs"]`)."""
        return self.program

    def _load(self) -> None:
        self._prog = self._load_chain("on_probe")
        self._load_tail_calls()
        self.program.attach_tracepoints(setup.mounted_tracefs() or setup.TRACEFS)

    def _load_tail_calls(self) -> None:
        """on_probe -> on_unwind (the stack) -> on_body (the logic): see bpf/unwind.h."""
        progs = self.bpf["probe_progs"]
        for index, name in enumerate(CHAIN):
            progs[ctypes.c_int(index)] = ctypes.c_int(self._load_chain(name))

    def _load_chain(self, name: str) -> int:
        """A program of the tail-call chain, typed for BPF_TRACE_UPROBE_MULTI links.

        The kernel lets programs share a prog array only when their
        expected_attach_type agrees (bpf_prog_map_compatible), so the whole
        chain gets one type; a multi-typed program cannot be linked to a perf
        event (EINVAL, measured on 6.18), so per-site mode loads plain ones.
        """
        return self.program.load_func(name, bpfsys.PROG_KPROBE, self._attach_type())

    def _attach_type(self) -> int:
        return perf_uprobe.BPF_TRACE_UPROBE_MULTI if self.multi else -1

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def configure_probes(self, type_ids: Callable[[str], int], packed: bytes | None = None
                         ) -> None:
        """One entry per site, written in one batch (call-site plans have thousands);
        `packed`: pack_probe_cfgs' rows, built while the compile was still running."""
        if self.sites:
            rows = packed if packed is not None else decode.pack_probe_cfgs(self.sites, type_ids)
            _update_array(self.bpf["probe_cfgs"], 0, abi.ProbeCfg, rows)

    def set_fixed_type(self, type_id: int, name: str) -> None:
        self.bpf["types"][ctypes.c_uint32(type_id)] = abi.TypeName(name.encode()[:31])

    def attach_all(self) -> None:
        """Install every planned probe; a failure is recorded, not hidden.

        Multi mode: all probes of one file (function, call-site and USDT probes with
        their semaphores) share one multi-uprobe link per direction: one syscall for
        thousands of sites, and one fd to close at detach.  A group the kernel
        refuses is retried one site per link, so the refused site is named, and
        `multi_refused` says why.  Otherwise one perf event and link per site.
        """
        self._attach(range(len(self.sites)))

    def _attach(self, indexes: Iterable[int]) -> None:
        """attach_all for the sites at `indexes` (all of them, or those added later)."""
        if not self.multi:
            for index in indexes:
                self._attach_one(index, self.sites[index])
            return
        for (module, ret), group in _multi_groups(self.sites, indexes).items():
            if not self._attach_multi(module, ret, group):
                for index in group:
                    self._attach_multi_one(index)

    def _attach_multi(self, module: str, retprobe: bool, indexes: list[int]) -> bool:
        try:
            self._link_multi(module, retprobe, indexes)
        except perf_uprobe.UprobeError as err:
            self.multi_refused.append(MultiRefusal(module, retprobe, len(indexes),
                                                   err.errno or 0, err.strerror or str(err)))
            return False
        self.multi_links += 1
        self.multi_sites += len(indexes)
        return True

    def _attach_multi_one(self, index: int) -> None:
        site = self.sites[index]
        try:
            self._link_multi(site.module, site.uretprobe, [index])
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_MULTI, err)

    def _link_multi(self, module: str, retprobe: bool, indexes: list[int]) -> None:
        sites = [self.sites[i] for i in indexes]
        self._links.append(perf_uprobe.link_uprobe_multi(
            self._prog, module, [s.file_offset for s in sites], indexes, retprobe,
            [s.ref_ctr_offset for s in sites]))

    def multi_notes(self) -> list[str]:
        """How probes were attached, for the report: a multi-link refusal is never silent."""
        notes = [f"{self.multi_sites} probe(s) attached through {self.multi_links} "
                 "multi-uprobe link(s)"] if self.multi_links else []
        if self.loader_links:
            notes.append("ld.so's r_debug updates probed through one multi-uprobe link")
        return notes + [f"{r.sites} probe(s) in {r.module} fell back to one link per site: "
                        f"the multi-uprobe link was refused: {r.message}"
                        for r in self.multi_refused]

    def _attach_one(self, index: int, site: ProbeSite) -> None:
        try:
            perf_fd = perf_uprobe.open_uprobe(site.module, site.file_offset,
                                              retprobe=site.uretprobe,
                                              ref_ctr_offset=site.ref_ctr_offset)
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_OPEN, err)
            return
        self._perf_fds.append(perf_fd)
        try:
            self._links.append(perf_uprobe.link_bpf(self._prog, perf_fd, index))
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_LINK, err)

    def _failed(self, index: int, stage: str, err: OSError) -> None:
        self.failed_probes.append(ProbeFailure(index, stage, err.errno or 0,
                                               err.strerror or str(err)))

    def attach_loader(self, path: str, sites: tuple[tuple[int, int], ...]) -> str | None:
        """Probe ld.so's calls to _dl_debug_state; returns why not, if it could not."""
        cookies = [delta & 0xFFFFFFFFFFFFFFFF for _, delta in sites]  # two's complement
        try:
            prog = self.program.load_func("on_ldso", bpfsys.PROG_KPROBE, self._attach_type())
            if self.multi:
                self._links.append(perf_uprobe.link_uprobe_multi(
                    prog, path, [offset for offset, _ in sites], cookies))
                self.loader_links += 1
                return None
            for (file_offset, _), cookie in zip(sites, cookies, strict=True):
                perf_fd = perf_uprobe.open_uprobe(path, file_offset)
                self._perf_fds.append(perf_fd)
                self._links.append(perf_uprobe.link_bpf(prog, perf_fd, cookie))
        except OSError as err:  # UprobeError, or a program the kernel refused
            return str(err)
        return None

    def require_all_attached(self) -> None:
        if self.failed_probes:
            first = self.failed_probes[0]
            site = self.sites[first.site_index]
            raise ProbeError(f"probe not installed: {site.role} {site.function} in "
                             f"{site.module}: {first.stage}: {first.message}")

    def detach(self) -> None:
        self._finish_deletes()
        for fds in (self._links, self._perf_fds):
            _close_all(fds)
        self._links, self._perf_fds = [], []
        self.program.cleanup()  # closing twice closes nothing

    # ---- processes -------------------------------------------------------
    def register_process(self, tgid: int) -> int:
        """Trace `tgid` (filtered mode); its forks are followed by the BPF side.

        Generations assigned here have the top bit set so they never equal
        one the BPF side assigns from gen_counter.
        """
        self._user_gen = getattr(self, "_user_gen", 0) + 1
        gen = (1 << 31) | self._user_gen
        self.bpf["procs"][ctypes.c_uint32(tgid)] = abi.ProcVal(gen=gen, flags=0, start_ns=0)
        return gen

    def process_gen(self, tgid: int) -> int | None:
        value = self.bpf["procs"].get(ctypes.c_uint32(tgid))
        return None if value is None else value.gen

    def open_events(self, callback: Callable[[LifecycleEvent | AnomalyRecord], None]) -> None:
        """Deliver ring-buffer events to `callback`.

        ctypes only prints exceptions raised inside a C callback; we keep the
        first one and re-raise it from poll() so a bug never drops events quietly.
        """
        self._callback_error: BaseException | None = None

        def on_raw(_ctx: object, data: int, _size: int) -> int:
            if self._callback_error is not None:
                return 0
            try:
                kind = ctypes.cast(data, ctypes.POINTER(ctypes.c_uint32)).contents.value
                if kind == EventKind.ANOMALY:
                    raw = ctypes.cast(data, ctypes.POINTER(abi.Anomaly)).contents
                    callback(decode.decode_anomaly(raw, self._type_name))
                else:
                    event = ctypes.cast(data, ctypes.POINTER(abi.Event)).contents
                    callback(decode.decode_event(event))
            except BaseException as err:  # noqa: BLE001 - re-raised in poll()
                self._callback_error = err
            return 0
        self.program.open_ring_buffer("events", on_raw)

    def poll(self, timeout_ms: int) -> None:
        self.program.poll(timeout_ms)
        if self._callback_error is not None:
            err, self._callback_error = self._callback_error, None
            raise err

    # ---- maps ------------------------------------------------------------
    def probe_hits(self) -> list[int]:
        """How often each planned probe fired, in plan order."""
        table = self.bpf["probe_hits"]
        return [sum(table[ctypes.c_int(i)]) for i in range(len(self.sites))]

    def stats(self) -> dict[Stat, int]:
        table = self.bpf["stats"]
        return {s: sum(table[ctypes.c_int(s.value)]) for s in Stat}

    def _type_name(self, type_id: int) -> str:
        if not type_id:
            return ""
        value = self.bpf["types"].get(ctypes.c_uint32(type_id))
        if value is None:
            return self.pruned_names.get(type_id, "")
        return str(value.name.decode(errors="replace"))

    def type_names(self) -> dict[int, str]:
        """Every type name known: in the kernel's table, or pruned from it."""
        return {**self.pruned_names, **self._kernel_type_names()}

    def _kernel_type_names(self) -> dict[int, str]:
        return {k.value: v.name.decode(errors="replace") for k, v in self.bpf["types"].items()}

    def drain(self, tgid: int, gen: int | None) -> list[ObjectRecord]:
        """Read and remove the objects of one process (gen None: whatever gen)."""
        self._finish_deletes()
        objs = self.bpf["objs"]
        names = self.type_names()
        picked = [(k, v) for k, v in _items(objs)
                  if k.tgid == tgid and (gen is None or v.gen == gen)]
        _delete(objs, [k for k, _ in picked])
        history = self._history([k for k, _ in picked], tgid)
        return [decode.decode_object(k, v, names, history.get(k.addr)) for k, v in picked]

    def drain_columns(self, tgid: int, gen: int | None) -> ObjectColumns:
        """drain() as columns, for a process without history: the map is read BATCH entries
        at a time, each batch decoded by C loops; only the process's keys are deleted."""
        self._finish_deletes()
        objs, builder = self.bpf["objs"], ColumnBuilder(abi.ObjKey, abi.ObjVal)
        size, doomed = ctypes.sizeof(abi.ObjKey), bytearray()
        for keys, values, n in _lookup_batches(objs):
            tgids = objcols.column(keys, abi.ObjKey, "tgid", n)
            gens = objcols.column(values, abi.ObjVal, "gen", n)
            keep = _rows_of(tgids, gens, tgid, gen, n)
            builder.add(keys, values, n, None if len(keep) == n else list(keep))
            raw = memoryview(keys).cast("B")
            if len(keep) == n:
                doomed += raw[:n * size]
            else:
                for i in keep:
                    doomed += raw[i * size:(i + 1) * size]
        if doomed:  # the kernel takes ~2 us a key: done while the report is made
            batch = (abi.ObjKey * (len(doomed) // size)).from_buffer(doomed)
            self._deleting: threading.Thread | None = threading.Thread(
                target=_delete, args=(objs, batch), daemon=True)
            self._deleting.start()
        return ObjectColumns(tgid, builder.columns, self.type_names())

    def _finish_deletes(self) -> None:
        """Wait for drain_columns' background delete (ctypes releases the GIL meanwhile)."""
        deleting = getattr(self, "_deleting", None)
        if deleting is not None:
            deleting.join()
            self._deleting = None

    def released_totals(self) -> dict[str, Totals]:
        """Per type name: (inits, gets, puts, releases) of objects released so far."""
        names = self.type_names()
        out: dict[str, Totals] = {}
        for key, per_cpu in self.bpf["totals"].items():
            add_totals(out, names.get(key.value, "") or "unknown", _cpu_sums(per_cpu))
        return out

    def type_count(self) -> int:
        return sum(1 for _ in self.bpf["types"].keys())

    def prune_types(self, keep: set[int]) -> dict[str, Totals]:
        """Remove type names (and their released totals) not in `keep` (the live
        objects' types), so the fixed-size table keeps room for new types; returns the
        totals removed, per name, for the caller to keep counting.  A type in use again
        later is interned again at its next init."""
        names, totals = self._kernel_type_names(), self.bpf["totals"]
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
                add_totals(folded, names[type_id], _cpu_sums(per_cpu))
                with contextlib.suppress(KeyError):
                    del totals[key]
            with contextlib.suppress(KeyError):
                del self.bpf["types"][self.bpf["types"].Key(type_id)]
        return folded

    def types_in_use(self) -> set[int]:
        """Type ids of live objects (per site with SITES: no walk of the objects)."""
        if self.opts.sites:
            return {keys[i].type_id for keys, values, n in
                    _lookup_batches(self.bpf["alloc_sites"]) for i in range(n)
                    if values[i].live > 0}
        self._finish_deletes()
        return {values[i].type_id for _, values, n in _lookup_batches(self.bpf["objs"])
                for i in range(n)}

    def map_fill(self) -> dict[str, tuple[int, int]]:
        """Entries in use and capacity of the maps that can fill up (O(sites) with SITES)."""
        def used(name: str) -> int:
            return sum(1 for _ in self.bpf[name].keys())
        fill = {"processes": (used("procs"), self.opts.max_procs),
                "types": (used("types"), self.opts.max_types)}
        if self.opts.sites:  # objects: their sites' live counts, not a walk of every key
            live = sum(values[i].live for _, values, n in
                       _lookup_batches(self.bpf["alloc_sites"]) for i in range(n))
            fill["objects"] = (max(0, live), self.opts.max_objects)
            fill["allocation_sites"] = (used("alloc_sites"), self.opts.max_alloc_sites)
            fill["age_bins"] = (used("age_bins"), self.opts.max_age_bins)
        else:
            fill["objects"] = (used("objs"), self.opts.max_objects)
        return fill

    def set_comm_filter(self, names: tuple[str, ...]) -> None:
        table = self.bpf["comm_allow"]
        for name in names:
            table[table.Key(name.encode()[:15])] = ctypes.c_uint32(1)

    def set_history_types(self, type_ids: list[int]) -> None:
        table = self.bpf["history_types"]
        for type_id in type_ids:
            table[ctypes.c_uint32(type_id)] = ctypes.c_uint32(1)

    def _history(self, keys: list[abi.ObjKey], tgid: int) -> dict[int, HistoryRecord]:
        """History of each drained object with its exact per-path counts; removed from
        the maps (the process's leftover path counts of released objects too)."""
        if self.opts.history is None:
            return {}
        table, values = self.bpf["history"], {}
        for key in keys:
            value = table.get(key)
            if value is not None:
                values[key.addr] = value
        _delete(table, [k for k in keys if k.addr in values])
        paths = self._drain_paths(tgid)
        return {addr: decode.decode_history(v, self.opts.history_depth,
                                      paths.get((addr, v.serial), ()))
                for addr, v in values.items()}

    def _drain_paths(self, tgid: int) -> dict[tuple[int, int], tuple[SiteCount, ...]]:
        """Per (address, serial): the exact path counts of `tgid`'s objects."""
        picked = _take(self.bpf["hist_paths"], tgid)
        out: dict[tuple[int, int], list[SiteCount]] = {}
        for k, v in picked:
            out.setdefault((k.addr, k.serial), []).append(SiteCount(
                Role(k.op), StackRef(k.stack_id, k.caller_ip), v.count, v.first_ns, v.last_ns))
        return {key: tuple(sites) for key, sites in out.items()}

    def take_process_stats(self, tgid: int) -> dict[Stat, int]:
        """The counters of one reported process; removed from the map."""
        picked = _take(self.bpf["proc_stats"], tgid)
        return {Stat(k.stat): int(getattr(v, "value", v)) for k, v in picked
                if k.stat < len(Stat)}

    def prune_process_stats(self, keep: Callable[[int], bool]) -> int:
        """Drop the counters of processes that will never be reported (not traced, or
        gone without a report); `keep(tgid)` says which must stay.  Returns how many."""
        table = self.bpf["proc_stats"]
        stale = [k for k, _ in _items(table) if not keep(k.tgid)]
        _delete(table, stale)
        return len(stale)

    def released_sites(self, tgid: int) -> list[ReleasedSite]:
        """What released objects of `tgid` did where (history only); removed from the map."""
        if self.opts.history is None:
            return []
        names = self.type_names()
        picked = _take(self.bpf["released_sites"], tgid)
        return [ReleasedSite(names.get(k.type_id, ""), SiteCount(
                    Role(k.op), StackRef(k.stack_id, k.caller_ip),
                    int(getattr(v, "value", v))))  # batch reads give ints, items() c_ulongs
                for k, v in picked]

    # ---- per allocation site (SITES, serve) ----------------------------------
    def set_checkpoint(self, at_ns: int) -> None:
        """Objects created from `at_ns` (CLOCK_MONOTONIC) on count as "since" per site;
        the counts of the previous checkpoint are dropped."""
        self.bpf["checkpoint"][ctypes.c_int(0)] = ctypes.c_uint64(at_ns)
        self.checkpoint_ns = at_ns
        since = self.bpf["since"]
        _delete(since, [k for k, _ in _items(since) if k.cp != at_ns])

    def site_lives(self, unnamed: bool = False) -> list[SiteLive]:
        """Every allocation site with live objects, per process: O(sites); `unnamed`:
        also the sites of objects whose type the kernel could not name, live or not
        (their operations are counted there, not per type)."""
        names, cp = self.type_names(), self.checkpoint_ns
        since: dict[bytes, tuple[int, int]] = {}
        if cp:
            for keys, values, n in _lookup_batches(self.bpf["since"]):
                for i in range(n):
                    if keys[i].cp == cp and values[i].live > 0:
                        since[bytes(keys[i].site)] = (values[i].live, values[i].age_sum)
        out = []
        for keys, values, n in _lookup_batches(self.bpf["alloc_sites"]):
            for i in range(n):
                k, v = keys[i], values[i]
                live, age_sum = since.get(bytes(k), (0, 0))
                if v.live <= 0 and not live and not (unnamed and not k.type_id):
                    continue
                out.append(decode.site_live(k, v, names, live, cp + (age_sum << 10) // live
                                      if live else 0))
        return out

    def take_sites(self, tgid: int, gen: int | None) -> list[SiteLive]:
        """A reported process's per-site counts, removed with its objects' other traces
        (gen None: whatever gen).  The caller names the unnamed ones' operations."""
        if not self.opts.sites:
            return []
        names = self.type_names()

        def mine(k: Any) -> bool:
            return bool(k.tgid == tgid and (gen is None or k.gen == gen))
        picked = [(k, v) for k, v in _items(self.bpf["alloc_sites"]) if mine(k)]
        _delete(self.bpf["alloc_sites"], [k for k, _ in picked])
        for name in ("since", "age_bins"):
            table = self.bpf[name]
            _delete(table, [k for k, _ in _items(table)
                            if mine(k.site if name == "since" else k)])
        return [decode.site_live(k, v, names, 0, 0) for k, v in picked]

    def age_bins(self, now_ns: int) -> list[AgeBin]:
        """Live objects per process, type and creation time (see age_view); bins no
        longer needed are removed.  O(types x bins), never O(objects)."""
        names, table = self.type_names(), self.bpf["age_bins"]
        rows: list[decode.AgeRow] = []
        keys = []
        for batch, values, n in _lookup_batches(table):
            for i in range(n):
                k = batch[i]
                rows.append((k.tgid, k.gen, k.type_id, k.name_ptr, k.bin, int(values[i])))
                keys.append(table.Key.from_buffer_copy(k))
        bins, doomed = decode.age_view(rows, now_ns)
        _delete(table, [keys[i] for i in doomed])
        return [AgeBin(tgid, names.get(type_id, "") if type_id else "", name_ptr, start, end,
                       count) for (tgid, _gen, type_id, name_ptr), start, end, count in bins]

    def live_objects(self) -> list[ObjectRecord]:
        self._finish_deletes()
        names = self.type_names()
        return [decode.decode_object(keys[i], values[i], names)
                for keys, values, n in _lookup_batches(self.bpf["objs"]) for i in range(n)]

    def forget_stacks(self, tgid: int, gen: int, refs: Iterable[StackRef]) -> None:
        """Free every stack-store entry a reported process created.

        Each entry is owned by one process generation (proc_stacks); without
        this a long attach fills the store.  `refs` are the stacks its report
        used (all owned by it: the hash covers tgid and gen).
        """
        owned = [k for k, v in _items(self.bpf["proc_stacks"])
                 if k.tgid == tgid and int(getattr(v, "value", v)) == gen]
        _delete(self.bpf["proc_stacks"], owned)
        # objects a forked child inherited keep their ancestor's stacks: not its to free
        keys = {r.stack_id for r in refs if self._stack_owner(r.stack_id) in ((tgid, gen), None)}
        keys |= {k.stack_id for k in owned}
        _delete(self.bpf["stack_store"], [ctypes.c_uint64(k) for k in sorted(keys) if k])

    def _stack_owner(self, stack_id: int) -> tuple[int, int] | None:
        """(tgid, gen) that stored a stack-store entry; None if there is no such entry."""
        try:
            rec = self.bpf["stack_store"][ctypes.c_uint64(stack_id)]
        except KeyError:
            return None
        return int(rec.tgid), int(rec.gen)

    # ---- unwind tables (bpf/unwind.h) -------------------------------------
    @property
    def unwinding(self) -> bool:
        return self.opts.unwind_offsets is not None

    def load_unwind_table(self, path: str, table: CfiTable | None = None) -> CfiTable | None:
        """Give BPF the CFI table of the file at `path` (once per file; `table`: read
        already); None if not loaded."""
        key = self.file_key(path)
        if key is None:
            return None
        if not self.unwinding or (key.ino, key.dev) in self._tables:
            return None
        self._tables.add((key.ino, key.dev))
        table = table if table is not None else cfi.load_table(path)
        first = self._cfi_rows_used
        if first + table.count > self.opts.max_cfi_rows:
            self.tables_not_loaded.append(path)
            return None
        if table.count:
            _update_array(self.bpf["cfi_rows"], first, abi.CfiRow, table.rows)
        self._cfi_rows_used += table.count
        self.bpf["cfi_modules"][key] = abi.CfiModule(
            first=first, count=table.count, flags=abi.MOD_FP if table.has_frame_pointers else 0,
            text_off=table.text_offset, build_id=(ctypes.c_uint8 * 20)(*table.build_id))
        return table

    def seed_exec_maps(self, tgid: int, maps: list[tuple[int, int, int, int, int]]) -> None:
        """Executable mappings (start, end, file offset, dev, ino) of a process that was
        running before tracing began (later ones are followed by the BPF side)."""
        if not self.unwinding or not maps:
            return
        value = abi.ExecMaps(n=min(len(maps), abi.MAX_EXEC_MAPS))
        for i, (start, end, pgoff, dev, ino) in enumerate(maps[:abi.MAX_EXEC_MAPS]):
            value.m[i] = abi.ExecMap(start=start, end=end, pgoff=pgoff,
                                     file=abi.FileKey(ino=ino, dev=dev))
        self.bpf["exec_maps"][ctypes.c_uint32(tgid)] = value

    # ---- modules mapped later, for exported call-site mode (HOLD) -----------
    def file_key(self, path: str) -> abi.FileKey | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return abi.FileKey(ino=st.st_ino, dev=os.major(st.st_dev) << 20 | os.minor(st.st_dev))

    @property
    def holding(self) -> bool:
        """Compiled with HOLD: processes mapping unscanned modules are stopped (it needs
        the unwinder's mapping hooks; `opts.hold` alone only reserves probe slots)."""
        return self.opts.hold and self.opts.unwind_offsets is not None

    @property
    def probe_capacity(self) -> int:
        """probe_cfgs' size as compiled (MAX_PROBES)."""
        return int(self.bpf["probe_cfgs"].max_entries)

    def vet(self, keys: Iterable[abi.FileKey], owner: bool = False) -> None:
        """Modules whose calls are accounted for: mapping them stops no process.
        `owner`: they define an exported function probed at its call sites."""
        if not self.holding:
            return
        for key in keys:
            self.bpf["vetted"][key] = ctypes.c_uint32(1)
            if owner:
                self.bpf["hold_owners"][key] = ctypes.c_uint32(1)

    def take_held(self) -> dict[int, abi.HoldKey]:
        """Processes the BPF side stopped (tgid -> the module it was mapping, or the
        function dlsym returned), forgotten here: the caller must continue each one."""
        if not self.holding:
            return {}
        return {key.value: value for key, value in _take_all(self.bpf["held"])}

    def hold_function(self, key: abi.HoldKey, on: bool = True) -> None:
        """dlsym returning this function (module, file offset) stops the process."""
        if not self.holding:
            return
        table = self.bpf["hold_funcs"]
        if on:
            table[key] = ctypes.c_uint32(1)
        else:
            with contextlib.suppress(KeyError):
                del table[key]

    def attach_dlsym(self, path: str, offsets: list[int]) -> str | None:
        """Return probes on dlsym/dlvsym (file offsets in `path`); why not, if not."""
        try:
            prog = self.program.load_func("on_dlsym_return", bpfsys.PROG_KPROBE,
                                          self._attach_type())
            if self.multi:
                self._links.append(perf_uprobe.link_uprobe_multi(
                    prog, path, offsets, [0] * len(offsets), True))
                return None
            for offset in offsets:
                perf_fd = perf_uprobe.open_uprobe(path, offset, retprobe=True)
                self._perf_fds.append(perf_fd)
                self._links.append(perf_uprobe.link_bpf(prog, perf_fd, 0))
        except OSError as err:  # UprobeError, or a program the kernel refused
            return str(err)
        return None

    def add_sites(self, sites: list[ProbeSite], type_ids: Callable[[str], int]) -> list[int]:
        """Configure and attach probes planned after start (a module mapped later);
        their indexes, or [] when the spare slots are used up (nothing attached)."""
        first = len(self.sites)
        if not sites or first + len(sites) > self.probe_capacity:
            return []
        self.sites.extend(sites)  # the plan's list: statuses follow
        _update_array(self.bpf["probe_cfgs"], first, abi.ProbeCfg,
                      decode.pack_probe_cfgs(sites, type_ids))
        indexes = list(range(first, first + len(sites)))
        self._attach(indexes)
        return indexes

    def disable_sites(self, indexes: list[int]) -> None:
        """Probes that must count nothing any more (their function went back to its
        entry probe): their configuration says so; the uprobes stay until detach."""
        table = self.bpf["probe_cfgs"]
        for index in indexes:
            cfg = table[ctypes.c_int(index)]
            cfg.role = Role.OFF.value
            table[ctypes.c_int(index)] = cfg

    def stack_record(self, stack_id: int) -> StackRecord | None:
        """One stored stack; None when none was recorded (counted by the kernel)."""
        if not stack_id:
            return None
        try:
            value = self.bpf["stack_store"][ctypes.c_uint64(stack_id)]
        except KeyError:  # freed: every entry is owned by one process, so never expected
            self.stacks_freed_early += 1
            return None
        return decode.decode_stack(value)


def _update_array(table: Any, first: int, row_type: Any, packed: bytes) -> None:
    """Write consecutive array entries from `first` on, in one syscall where possible."""
    count = len(packed) // ctypes.sizeof(row_type)
    values = (row_type * count).from_buffer_copy(packed)
    keys = (ctypes.c_int * count)(*range(first, first + count))
    try:
        table.items_update_batch(keys, values)
        return
    except Exception:  # noqa: BLE001 - kernels or map types without batch updates
        pass
    for i in range(count):
        table[ctypes.c_int(first + i)] = values[i]


def _multi_groups(sites: list[ProbeSite], indexes: Iterable[int]
                  ) -> dict[tuple[str, bool], list[int]]:
    """Indexes of `sites` per (file, uretprobe) that a multi-uprobe link can carry."""
    groups: dict[tuple[str, bool], list[int]] = {}
    for index in indexes:
        site = sites[index]
        groups.setdefault((site.module, site.uretprobe), []).append(index)
    return groups


def _delete(table: Any, keys: list[Any] | ctypes.Array[Any]) -> None:
    """Delete many keys in one syscall where the kernel allows it."""
    if not len(keys):
        return
    try:
        # not a generator when given keys: iterating its None used to fail after the
        # batch had deleted everything, and every key was then deleted (again) one by one
        batch = keys if isinstance(keys, ctypes.Array) else (type(keys[0]) * len(keys))(*keys)
        table.items_delete_batch(batch)
        return
    except Exception:  # noqa: BLE001 - map types or kernels without batch deletes
        pass
    for key in keys:
        try:
            del table[key]
        except KeyError:
            pass


BATCH = 65536  # map entries read per syscall by drain_columns
MAX_PRUNED_NAMES = 1 << 16  # pruned type names remembered (oldest forgotten first)


def _close_all(fds: list[int]) -> None:
    """Close in parallel: removing a uprobe waits ~35 ms for the kernel (RCU) here, and
    the waits of concurrent closes overlap (a detach of 30 probes: 1.1 s one by one)."""
    def close(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)
    threads = [threading.Thread(target=close, args=(fd,)) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _rows_of(tgids: memoryview, gens: memoryview, tgid: int, gen: int | None, n: int
             ) -> range | list[int]:
    """Rows of one process (and generation); counted in C when all rows are its own."""
    if tgids.tolist().count(tgid) == n and (gen is None or gens.tolist().count(gen) == n):
        return range(n)
    return [i for i in range(n) if tgids[i] == tgid and (gen is None or gens[i] == gen)]


def _lookup_batches(table: bpfsys.Table
                    ) -> Iterator[tuple[ctypes.Array[Any], ctypes.Array[Any], int]]:
    """(keys, values, n) per BPF_MAP_LOOKUP_BATCH; the buffers are reused between batches."""
    return table.lookup_batches(BATCH)


def _take_all(table: bpfsys.Table) -> list[tuple[Any, Any]]:
    """Every entry, removed from the map."""
    items = _items(table)
    _delete(table, [k for k, _ in items])
    return items


def _take(table: Any, tgid: int) -> list[tuple[Any, Any]]:
    """The entries of process `tgid` (keys with a tgid field), removed from the map."""
    picked = [(k, v) for k, v in _items(table) if k.tgid == tgid]
    _delete(table, [k for k, _ in picked])
    return picked


def _cpu_sums(per_cpu: Any) -> Totals:
    """A per-CPU struct type_totals summed over the CPUs."""
    a, b, c, d = (sum(getattr(cpu, f) for cpu in per_cpu)
                  for f in ("inits", "gets", "puts", "released"))
    return (a, b, c, d)


def _items(table: bpfsys.Table) -> list[tuple[Any, Any]]:
    try:
        return list(table.items_lookup_batch())
    except OSError:  # older kernels / map types without batch ops
        return table.items()
