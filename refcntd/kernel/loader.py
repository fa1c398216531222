"""Load bpf/refcntd.c's programs (made by program.py) and hand out its parts.

`Kernel` loads the programs, delivers the ring buffer's events, registers the
processes to trace and detaches; everything else is one part per caller, each
behind a Protocol of parts.py:

    kernel.probes     probes.BpfProbes          attach, add or disable, configure
    kernel.objects    objects.BpfObjects        drains, live objects, history, stacks
    kernel.types      typetable.BpfTypeTable    type names, released totals
    kernel.site_maps  sitemaps.BpfSiteMaps      per-site and per-age counts
    kernel.holds      holdmaps.BpfHoldMaps      processes stopped for a scan
    kernel.unwind     unwindmaps.BpfUnwindMaps  the unwinder's tables

Everything they return is a frozen dataclass from records.py.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING

from refcntd.errors import EnvironmentProblem
from refcntd.inputs.config import COMM_MAX
from refcntd.kernel import abi, bpfsys, decode, parts, progcache, setup
from refcntd.kernel.abi import EventKind, Stat
from refcntd.kernel.holdmaps import BpfHoldMaps
from refcntd.kernel.maps import BackgroundDelete, items, lookup_batches
from refcntd.kernel.objects import BpfObjects
from refcntd.kernel.probes import BpfProbes, attach_type
from refcntd.kernel.program import CHAIN, KernelOptions, Program, compile_program
from refcntd.kernel.records import AnomalyRecord, LifecycleEvent
from refcntd.kernel.sitemaps import BpfSiteMaps
from refcntd.kernel.typetable import BpfTypeTable
from refcntd.kernel.unwindmaps import BpfUnwindMaps
from refcntd.paths import CACHE_DIR

if TYPE_CHECKING:  # attach's start imports this module: not the binary analysis with it
    from refcntd.binary.probesite import ProbeSite

USER_GEN_BIT = 1 << 31  # generations given here; the BPF side's gen_counter never sets it


class Kernel:
    """Loaded BPF state and attached probes; a context manager that always detaches.

    Construction touches nothing outside: call kernel.setup.prepare() once first
    (privileges, tracefs, BCC_KERNEL_SOURCE).
    """

    def __init__(self, opts: KernelOptions, sites: list[ProbeSite], program: Program | None = None,
                 multi: bool | None = None) -> None:
        """`program`: bpf/refcntd.c already compiled for `opts` (compile_program).

        `multi`: attach through BPF_TRACE_UPROBE_MULTI links; False: one perf event per
        site (the programs are then loaded as plain kprobe programs: the kernel links
        a multi-typed program to nothing else); None: as the running kernel allows
        (program.kernel_choices: per site where it has no multi-uprobe links).
        """
        self.opts = opts
        self._user_gen = 0  # generations register_process gave out
        self._callback_error: BaseException | None = None  # raised by the next poll()
        self._prog = -1  # on_probe's fd, once loaded
        self.program = program if program is not None else compile_program(opts, len(sites))
        self.multi = self.program.choices.multi if multi is None else multi
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
        pending = BackgroundDelete()  # drained objects' delete: walks of objs wait for it
        self.probes = BpfProbes(self.program, sites, self._prog, self.multi)
        self.types = BpfTypeTable(self.program, opts, pending)
        self.objects = BpfObjects(self.program, opts, self.types.names, pending)
        self.site_maps = BpfSiteMaps(self.program, opts, self.types.names)
        self.holds = BpfHoldMaps(self.program, opts)
        self.unwind = BpfUnwindMaps(self.program, opts)
        self._pending = pending

    def notes(self) -> list[str]:
        """The fallbacks the running kernel needed (one note each), for the report."""
        return list(self.program.choices.notes)

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
        return self.program.load_func(name, bpfsys.PROG_KPROBE, attach_type(self.multi))

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def detach(self, unprobed: Callable[[], None] = lambda: None) -> None:
        """Close the probes, call `unprobed` (the maps are still readable and no probe
        can fire any more: the held processes are continued there), then the maps."""
        self._pending.wait()
        self.probes.close()
        try:
            unprobed()
        finally:
            self.program.cleanup()  # closing twice closes nothing

    # ---- what to trace -----------------------------------------------------
    def register_process(self, tgid: int) -> int:
        """Trace `tgid` (filtered mode); its forks are followed by the BPF side.

        Generations assigned here have the top bit set so they never equal
        one the BPF side assigns from gen_counter.
        """
        self._user_gen += 1
        gen = USER_GEN_BIT | self._user_gen
        self.bpf["procs"][ctypes.c_uint32(tgid)] = abi.ProcVal(gen=gen, flags=0, start_ns=0)
        return gen

    def set_comm_filter(self, names: tuple[str, ...]) -> None:
        table = self.bpf["comm_allow"]
        for name in names:
            table[table.Key(name.encode()[:COMM_MAX])] = ctypes.c_uint32(1)

    def set_exe_filter(self, paths: tuple[str, ...]) -> list[str]:
        """Trace only processes running one of `paths` (knob exe_filter); returns the
        paths that name no file (left out)."""
        table, missing = self.bpf["exe_allow"], []
        for path in paths:
            key = decode.file_key(path)
            if key is None:
                missing.append(path)
            else:
                table[key] = ctypes.c_uint32(1)
        return missing

    def set_history_types(self, type_ids: list[int]) -> None:
        table = self.bpf["history_types"]
        for type_id in type_ids:
            table[ctypes.c_uint32(type_id)] = ctypes.c_uint32(1)

    # ---- events --------------------------------------------------------------
    def open_events(self, callback: Callable[[LifecycleEvent | AnomalyRecord], None]) -> None:
        """Deliver ring-buffer events to `callback`.

        ctypes only prints exceptions raised inside a C callback; we keep the
        first one and re-raise it from poll() so a bug never drops events quietly.
        """
        self._callback_error = None

        def on_raw(_ctx: object, data: int, _size: int) -> int:
            if self._callback_error is not None:
                return 0
            try:
                kind = ctypes.cast(data, ctypes.POINTER(ctypes.c_uint32)).contents.value
                if kind == EventKind.ANOMALY:
                    raw = ctypes.cast(data, ctypes.POINTER(abi.Anomaly)).contents
                    callback(decode.decode_anomaly(raw, self.types.name_of))
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

    # ---- counters ------------------------------------------------------------
    def stats(self) -> dict[Stat, int]:
        """Every counter, summed over the CPUs, in one batch read: a lookup per counter
        was ~30 syscalls per tracer and scrape, each one a wait to take the GIL back
        from the report workers (scrapes of 100-500 ms in the soak, issue 43)."""
        sums = {int(k.value): sum(v) for k, v in items(self.bpf["stats"])}
        return {s: sums.get(s.value, 0) for s in Stat}

    def map_fill(self) -> dict[str, tuple[int, int]]:
        """Entries in use and capacity of the maps that can fill up (O(sites) with SITES),
        counted by batch reads, not a syscall per key."""
        def used(name: str) -> int:
            return sum(n for _, _, n in lookup_batches(self.bpf[name]))
        fill = {"processes": (used("procs"), self.opts.max_procs),
                "types": (used("types"), self.opts.max_types)}
        if self.opts.sites:  # objects: their sites' live counts, not a walk of every key
            live = sum(values[i].live for _, values, n in
                       lookup_batches(self.bpf["alloc_sites"]) for i in range(n))
            fill["objects"] = (max(0, live), self.opts.max_objects)
            fill["allocation_sites"] = (used("alloc_sites"), self.opts.max_alloc_sites)
            fill["age_bins"] = (used("age_bins"), self.opts.max_age_bins)
        else:
            fill["objects"] = (used("objs"), self.opts.max_objects)
        return fill


if TYPE_CHECKING:  # mypy proves that each part gives what its Protocol promises
    _PROBES: type[parts.Probes] = BpfProbes
    _OBJECTS: type[parts.Objects] = BpfObjects
    _TYPES: type[parts.TypeTable] = BpfTypeTable
    _SITE_MAPS: type[parts.SiteMaps] = BpfSiteMaps
    _HOLDS: type[parts.HoldMaps] = BpfHoldMaps
    _UNWIND: type[parts.UnwindMaps] = BpfUnwindMaps
