"""The only module that imports bcc: load bpf/refcntd.c, attach, read maps.

Everything it returns is a frozen dataclass from records.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from refcntd.binary.plan import ProbeSite
from refcntd.binary.sdt import ArgLoc
from refcntd.errors import EnvironmentProblem, ProbeError
from refcntd.kernel import abi, perf_uprobe
from refcntd.kernel.abi import AnomalyKind, EventKind, Role, Stat
from refcntd.kernel.records import (
    STAGE_LINK,
    STAGE_OPEN,
    AnomalyRecord,
    HistoryEvent,
    HistoryRecord,
    LifecycleEvent,
    ObjectRecord,
    ProbeFailure,
    RawFrame,
    ReleasedSite,
    SiteCount,
    StackRef,
)
from refcntd.paths import BPF_DIR


@dataclass(frozen=True)
class KernelOptions:
    filtered: bool  # only processes registered in `procs` (run, --pid)
    has_delete: bool
    max_objects: int = 1 << 20
    max_stacks: int = 8192
    max_procs: int = 16384
    max_types: int = 1024
    max_graves: int = 16384
    exit_code_offset: int | None = None
    loader_probe: bool = False  # attach on_loader at ld.so's _dl_debug_state calls
    history: tuple[str, ...] | None = None  # type names, ("all",), or None: no history
    history_depth: int = 16  # events kept per object; a power of two
    max_history: int = 65536  # objects with a history at once
    max_sites: int = 16384
    comm_filter: tuple[str, ...] = ()  # system-wide: only these command names
    cgroup_id: int | None = None  # system-wide: only this cgroup v2

def bpf_cflags(opts: KernelOptions, probe_count: int) -> list[str]:
    """Every -D the BPF program is compiled with, from one validated options object."""
    flags = [f"-I{BPF_DIR}", f"-DFILTERED={int(opts.filtered)}",
             f"-DHAS_DELETE={int(opts.has_delete)}", f"-DMAX_OBJECTS={opts.max_objects}",
             f"-DMAX_STACKS={opts.max_stacks}", f"-DMAX_PROCS={opts.max_procs}",
             f"-DMAX_TYPES={opts.max_types}", f"-DMAX_PROBES={max(probe_count, 1)}",
             f"-DMAX_GRAVES={opts.max_graves}"]
    if opts.exit_code_offset is not None:
        flags.append(f"-DEXIT_CODE_OFFSET={opts.exit_code_offset}")
    flags.append(f"-DLOADER_PROBE={int(opts.loader_probe)}")
    flags.append(f"-DFILTER_COMM={int(bool(opts.comm_filter))}")
    if opts.cgroup_id is not None:
        flags.append(f"-DCGROUP_ID={opts.cgroup_id}ULL")
    flags += [f"-DHISTORY={int(opts.history is not None)}",
              f"-DHISTORY_ALL={int(opts.history == ('all',))}",
              f"-DHISTORY_DEPTH={opts.history_depth}", f"-DMAX_HISTORY={opts.max_history}",
              f"-DMAX_SITES={opts.max_sites}"]
    return flags


def _import_bcc() -> object:
    try:
        import bcc
    except ImportError as err:
        raise EnvironmentProblem(f"bcc is not importable ({err})",
                                 "install python3-bpfcc and use a venv made with "
                                 "--system-site-packages from /usr/bin/python3") from None
    return bcc


class Kernel:
    """Loaded BPF state and attached probes; a context manager that always detaches.

    Construction touches nothing outside: call kernel.setup.prepare() once first
    (privileges, tracefs, BCC_KERNEL_SOURCE).
    """

    def __init__(self, opts: KernelOptions, sites: list[ProbeSite]) -> None:
        bcc = _import_bcc()
        self._bcc = bcc
        self.opts, self.sites = opts, sites
        self._links: list[int] = []
        self._perf_fds: list[int] = []
        self.failed_probes: list[ProbeFailure] = []
        self.stacks_freed_early = 0  # counted in the report: never silent
        try:
            self.bpf = bcc.BPF(src_file=str(BPF_DIR / "refcntd.c"),
                               cflags=bpf_cflags(opts, len(sites)))
            self.layout_checked = _check_layout(self.bpf, opts)
            self._prog = self.bpf.load_func("on_probe", bcc.BPF.KPROBE)
        except EnvironmentProblem:
            raise
        except Exception as err:  # bcc raises bare Exception for compile/load errors
            raise EnvironmentProblem(f"the BPF program failed to compile or load: {err}",
                                     "check kernel headers (BCC_KERNEL_SOURCE)") from None

    def __enter__(self) -> Kernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def configure_probes(self, type_ids: Callable[[str], int]) -> None:
        cfgs = self.bpf["probe_cfgs"]
        for index, site in enumerate(self.sites):
            cfgs[ctypes.c_int(index)] = _probe_cfg(site, type_ids)

    def set_fixed_type(self, type_id: int, name: str) -> None:
        self.bpf["types"][ctypes.c_uint32(type_id)] = abi.TypeName(name.encode()[:31])

    def attach_all(self) -> None:
        """Install every planned probe; a failure is recorded (typed), not hidden."""
        for index, site in enumerate(self.sites):
            try:
                perf_fd = perf_uprobe.open_uprobe(site.module, site.file_offset,
                                                  retprobe=site.is_return,
                                                  ref_ctr_offset=site.ref_ctr_offset)
            except perf_uprobe.UprobeError as err:
                self._failed(index, STAGE_OPEN, err)
                continue
            self._perf_fds.append(perf_fd)
            try:
                self._links.append(self._link(perf_fd, index))
            except perf_uprobe.UprobeError as err:
                self._failed(index, STAGE_LINK, err)

    def _link(self, perf_fd: int, index: int) -> int:
        return perf_uprobe.link_bpf(self._prog.fd, perf_fd, index)

    def _failed(self, index: int, stage: str, err: OSError) -> None:
        self.failed_probes.append(ProbeFailure(index, stage, err.errno or 0,
                                               err.strerror or str(err)))

    def attach_loader(self, path: str, sites: tuple[tuple[int, int], ...]) -> str | None:
        """Probe ld.so's calls to _dl_debug_state; returns why not, if it could not."""
        try:
            prog = self.bpf.load_func("on_loader", self._bcc.BPF.KPROBE)
            for file_offset, delta in sites:
                perf_fd = perf_uprobe.open_uprobe(path, file_offset)
                self._perf_fds.append(perf_fd)
                cookie = delta & 0xFFFFFFFFFFFFFFFF  # two's complement in the u64 cookie
                self._links.append(perf_uprobe.link_bpf(prog.fd, perf_fd, cookie))
        except Exception as err:  # UprobeError, or bcc's bare Exception from load_func
            return str(err)
        return None

    def require_all_attached(self) -> None:
        if self.failed_probes:
            first = self.failed_probes[0]
            site = self.sites[first.site_index]
            raise ProbeError(f"probe not installed: {site.role} {site.function} in "
                             f"{site.module}: {first.stage}: {first.message}")

    def detach(self) -> None:
        for fd in self._links + self._perf_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._links, self._perf_fds = [], []
        bpf = getattr(self, "bpf", None)
        if bpf is not None:
            bpf.cleanup()
            self.bpf = None

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
                    callback(_decode_anomaly(raw, self._type_name))
                else:
                    raw = ctypes.cast(data, ctypes.POINTER(abi.Event)).contents
                    callback(_decode_event(raw))
            except BaseException as err:  # noqa: BLE001 - re-raised in poll()
                self._callback_error = err
            return 0
        self._on_raw = on_raw  # bcc keeps only a weak reference
        self.bpf["events"].open_ring_buffer(on_raw)

    def poll(self, timeout_ms: int) -> None:
        self.bpf.ring_buffer_poll(timeout_ms)
        if self._callback_error is not None:
            err, self._callback_error = self._callback_error, None
            raise err

    # ---- maps ------------------------------------------------------------
    def stats(self) -> dict[Stat, int]:
        table = self.bpf["stats"]
        return {s: sum(table[ctypes.c_int(s.value)]) for s in Stat}

    def _type_name(self, type_id: int) -> str:
        if not type_id:
            return ""
        value = self.bpf["types"].get(ctypes.c_uint32(type_id))
        return value.name.decode(errors="replace") if value is not None else ""

    def type_names(self) -> dict[int, str]:
        return {k.value: v.name.decode(errors="replace") for k, v in self.bpf["types"].items()}

    def drain(self, tgid: int, gen: int | None) -> list[ObjectRecord]:
        """Read and remove the objects of one process (gen None: whatever gen)."""
        objs = self.bpf["objs"]
        names = self.type_names()
        picked = [(k, v) for k, v in _items(objs)
                  if k.tgid == tgid and (gen is None or v.gen == gen)]
        _delete(objs, [k for k, _ in picked])
        history = self._history([k for k, _ in picked])
        return [_decode_object(k, v, names, history.get(k.addr)) for k, v in picked]

    def released_totals(self) -> dict[str, tuple[int, int, int, int]]:
        """Per type name: (inits, gets, puts, releases) of objects released so far."""
        names, out = self.type_names(), {}
        for key, per_cpu in self.bpf["totals"].items():
            name = names.get(key.value, "") or "unknown"
            sums = [sum(getattr(c, f) for c in per_cpu)
                    for f in ("inits", "gets", "puts", "released")]
            old = out.get(name, (0, 0, 0, 0))
            out[name] = tuple(a + b for a, b in zip(old, sums, strict=True))
        return out

    def map_fill(self) -> dict[str, tuple[int, int]]:
        """Entries in use and capacity of the maps that can fill up."""
        def used(name: str) -> int:
            return sum(1 for _ in self.bpf[name].keys())
        return {"objects": (used("objs"), self.opts.max_objects),
                "processes": (used("procs"), self.opts.max_procs),
                "types": (used("types"), self.opts.max_types)}

    def set_comm_filter(self, names: tuple[str, ...]) -> None:
        table = self.bpf["comm_allow"]
        for name in names:
            table[table.Key(name.encode()[:15])] = ctypes.c_uint32(1)

    def set_history_types(self, type_ids: list[int]) -> None:
        table = self.bpf["history_types"]
        for type_id in type_ids:
            table[ctypes.c_uint32(type_id)] = ctypes.c_uint32(1)

    def _history(self, keys: list[abi.ObjKey]) -> dict[int, HistoryRecord]:
        """History of each drained object, removed from the map."""
        if self.opts.history is None:
            return {}
        table, out = self.bpf["history"], {}
        for key in keys:
            value = table.get(key)
            if value is None:
                continue
            out[key.addr] = _decode_history(value, self.opts.history_depth)
            try:
                del table[key]
            except KeyError:
                pass
        return out

    def released_sites(self, tgid: int) -> list[ReleasedSite]:
        """What released objects of `tgid` did where (history only); removed from the map."""
        if self.opts.history is None:
            return []
        table, names = self.bpf["released_sites"], self.type_names()
        picked = [(k, v) for k, v in _items(table) if k.tgid == tgid]
        for key, _ in picked:
            try:
                del table[key]
            except KeyError:
                pass
        return [ReleasedSite(names.get(k.type_id, ""), SiteCount(
                    Role(k.op), StackRef(k.stack_id, k.raw_stack_id, k.caller_ip),
                    int(getattr(v, "value", v))))  # batch reads give ints, items() c_ulongs
                for k, v in picked]

    def live_objects(self) -> list[ObjectRecord]:
        names = self.type_names()
        return [_decode_object(k, v, names) for k, v in _items(self.bpf["objs"])]

    def forget_stacks(self, tgid: int, gen: int, refs: Iterable[StackRef]) -> None:
        """Free every stack-store entry a reported process created.

        The kernel never frees stack ids, and with ASLR every process's stacks
        are distinct: without this a long attach fills the stores, and bucket
        collisions (a stack refused because its bucket holds another) multiply.
        """
        owned = [k for k, v in _items(self.bpf["proc_stacks"])
                 if k.tgid == tgid and int(getattr(v, "value", v)) == gen]
        _delete(self.bpf["proc_stacks"], owned)
        ids = {(r.stack_id, r.raw_stack_id) for r in refs}
        ids |= {(k.stack_id, k.raw_stack_id) for k in owned}
        for table, column in ((self.bpf["stacks"], 0), (self.bpf["raw_stacks"], 1)):
            for stack_id in {pair[column] for pair in ids}:
                if stack_id >= 0:
                    with contextlib.suppress(KeyError):
                        del table[ctypes.c_int(stack_id)]

    def raw_stack(self, stack_id: int) -> tuple[int, ...]:
        if stack_id < 0:
            return ()
        try:
            return tuple(ip for ip in self.bpf["raw_stacks"][ctypes.c_int(stack_id)].ip if ip)
        except KeyError:
            return ()

    def stack(self, stack_id: int) -> tuple[RawFrame, ...]:
        if stack_id < 0:
            return ()
        try:
            value = self.bpf["stacks"][ctypes.c_int(stack_id)]
        except KeyError:
            # freed with an exited process that had the very same stack (no ASLR)
            self.stacks_freed_early += 1
            return ()
        frames = []
        for frame in value.frame:
            if frame.status == 0:
                break
            build_id = bytes(frame.build_id).hex() if frame.status == 1 else None
            frames.append(RawFrame(build_id, frame.offset))
        return tuple(frames)


def _delete(table: object, keys: list) -> None:
    """Delete many keys in one syscall where the kernel allows it."""
    if not keys:
        return
    try:
        batch = (type(keys[0]) * len(keys))(*keys)
        for _ in table.items_delete_batch(batch):
            pass
        return
    except Exception:  # noqa: BLE001 - map types or kernels without batch deletes
        pass
    for key in keys:
        try:
            del table[key]
        except KeyError:
            pass


def _items(table: object) -> Iterable[tuple[object, object]]:
    try:
        return list(table.items_lookup_batch())
    except Exception:  # older kernels / map types without batch ops
        return list(table.items())


def _probe_cfg(site: ProbeSite, type_ids: Callable[[str], int]) -> abi.ProbeCfg:
    role = site.spec_role
    cfg = abi.ProbeCfg(role=Role[site.role.upper()].value, caller_sp=site.caller_sp_offset,
                          is_return=int(site.is_return), obj=_arg_loc(site.obj_loc))
    if site.type_loc is not None:
        cfg.type = _arg_loc(site.type_loc)
    elif role.type_name is not None and role.type_name.constant is not None:
        cfg.fixed_type = type_ids(str(role.type_name.constant))
    if site.count_loc is not None:
        cfg.count = _arg_loc(site.count_loc)
    elif role.initial_count is not None and role.initial_count.constant is not None:
        cfg.fixed_count = int(role.initial_count.constant)
    return cfg


def _arg_loc(loc: ArgLoc) -> abi.ArgLoc:
    return abi.ArgLoc(kind=loc.kind, size=loc.size, is_signed=int(loc.signed),
                         reg_off=loc.reg_offset, value=loc.value)


def _map_names(bpf: Any) -> list[str]:
    from bcc.libbcc import lib  # the loader is the one module that may import bcc
    lib.bpf_num_tables.restype = ctypes.c_ulonglong  # in libbcc, not declared by bcc's Python
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
    return [lib.bpf_table_name(bpf.module, i).decode()
            for i in range(lib.bpf_num_tables(bpf.module))]


def _check_layout(bpf: Any, opts: KernelOptions) -> set[str]:
    """Every map whose key or value is a struct of bpf/refcntd.h must match abi.py exactly.

    Returns the structs compared, so a test can see the check really ran.
    """
    mirrors = dict(abi.STRUCTS)
    mirrors["hist_val"] = abi.hist_val_type(opts.history_depth)
    checked: set[str] = set()
    for name in _map_names(bpf):
        table = bpf[name]
        for what, theirs in (("key", table.Key), ("value", table.Leaf)):
            if theirs.__name__.rsplit("_Array_", 1)[-1].isdigit():  # per-CPU values
                theirs = theirs._type_
            mine = mirrors.get(theirs.__name__)
            if mine is None:
                continue
            checked.add(theirs.__name__)
            if mine is not None:
                problem = layout_difference(mine, theirs)
                if problem:
                    raise EnvironmentProblem(
                        f"map {name}: {what} struct {theirs.__name__} differs between "
                        f"bpf/refcntd.h as compiled and refcntd/kernel/abi.py: {problem}",
                        "run `python -m refcntd.kernel.abigen` after changing the header")
    return checked


def layout_difference(mine: Any, theirs: Any, prefix: str = "") -> str:
    """'' when both ctypes layouts have the same fields at the same offsets and sizes.

    bcc's Python decoder keeps only the outer dimension of a 2-D array
    (`char argv[8][128]` arrives as `char[8]`): such a field is compared by
    offset and outer length, and the struct's total size is then not comparable.
    """
    if not hasattr(mine, "_fields_"):
        if ctypes.sizeof(mine) != ctypes.sizeof(theirs):
            return f"{prefix.rstrip('.') or 'size'}: {ctypes.sizeof(mine)} vs " \
                   f"{ctypes.sizeof(theirs)} bytes"
        return ""
    ours = [f[0] for f in mine._fields_]
    their_types = {f[0]: f[1] for f in getattr(theirs, "_fields_", [])
                   if not f[0].startswith("__pad")}  # bcc names its own padding
    if ours != list(their_types):
        return f"{prefix}fields {ours} vs {list(their_types)}"
    collapsed = False
    for name, sub in mine._fields_:
        a, b = getattr(mine, name), getattr(theirs, name)
        if a.offset != b.offset:
            return f"{prefix}{name}: offset {a.offset} vs {b.offset}"
        if _collapsed_2d(sub, their_types[name]):
            collapsed = True
            continue
        problem = layout_difference(sub, their_types[name], f"{prefix}{name}.")
        if problem:
            return problem
    if not collapsed and ctypes.sizeof(mine) != ctypes.sizeof(theirs):
        return f"{prefix or 'size: '}{ctypes.sizeof(mine)} vs {ctypes.sizeof(theirs)} bytes"
    return ""


def _collapsed_2d(mine: Any, theirs: Any) -> bool:
    inner = getattr(mine, "_type_", None)
    return (hasattr(inner, "_length_") and getattr(theirs, "_length_", None) == mine._length_
            and not hasattr(getattr(theirs, "_type_", None), "_length_"))


def _decode_event(raw: abi.Event) -> LifecycleEvent:
    argv = tuple(_argv_slot(bytes(raw.argv[i]))
                 for i in range(min(raw.argc, abi.ARGV_SLOTS)))
    return LifecycleEvent(EventKind(raw.kind), raw.tgid, raw.pid, raw.gen, raw.ts,
                          raw.exit_code, raw.comm.decode(errors="replace"),
                          raw.path.decode(errors="replace"), argv)


def _decode_anomaly(raw: abi.Anomaly, type_name: Callable[[int], str]) -> AnomalyRecord:
    where = StackRef(raw.stack_id, raw.raw_stack_id, raw.caller_ip)
    alloc = (StackRef(raw.alloc_stack_id, raw.alloc_raw_stack_id, raw.alloc_caller_ip)
             if raw.alloc_stack_id != -1 or raw.init_ns else None)
    return AnomalyRecord(AnomalyKind(raw.anomaly), raw.tgid, raw.tid, raw.gen, raw.ts, raw.addr,
                         raw.count_before, type_name(raw.type_id), raw.name_ptr, where, alloc,
                         raw.init_ns, raw.released_ns)


def _argv_slot(raw: bytes) -> str:
    """One argv string; a slot filled to the end was cut short, and says so."""
    text = raw.split(b"\0", 1)[0]
    suffix = "..." if len(text) >= abi.ARGV_LEN - 1 else ""
    return text.decode(errors="replace") + suffix


def _decode_object(key: abi.ObjKey, val: abi.ObjVal, names: dict[int, str],
                   history: HistoryRecord | None = None) -> ObjectRecord:
    type_name = names.get(val.type_id, "") if val.type_id else ""
    return ObjectRecord(key.tgid, val.gen, key.addr, val.count, type_name, val.init_ns,
                        val.stack_id, val.raw_stack_id, val.caller_ip, val.name_ptr, val.gets,
                        val.puts, history)


def _decode_history(value: ctypes.Structure, depth: int) -> HistoryRecord:
    kept = min(value.n, depth)
    events = tuple(HistoryEvent(Role(e.op), e.count_after,
                                StackRef(e.stack_id, e.raw_stack_id, e.caller_ip), e.ts)
                   for e in value.e[:kept])
    sites = tuple(SiteCount(Role(s.op), StackRef(s.stack_id, s.raw_stack_id, s.caller_ip),
                            s.count) for s in value.site if s.count)
    return HistoryRecord(value.n, events, sites, value.site_overflow)
