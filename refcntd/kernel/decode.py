"""The kernel's structs to records and back: each probe's configuration row packed
for the kernel, and map values and ring-buffer events decoded into records.py's
frozen dataclasses (nothing after the kernel stage sees ctypes)."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from refcntd.inputs.files import file_stamp
from refcntd.kernel import abi
from refcntd.kernel.abi import AnomalyKind, EventKind, Role, Truncation, UnwindMethod
from refcntd.kernel.records import (
    AnomalyRecord,
    HistoryEvent,
    HistoryRecord,
    LifecycleEvent,
    ObjectRecord,
    RawFrame,
    SiteCount,
    SiteLive,
    StackRecord,
    StackRef,
)

if TYPE_CHECKING:
    from refcntd.binary.probesite import ProbeSite
    from refcntd.binary.sdt import ArgLoc
    from refcntd.inputs.spec import RoleSpec


def file_key(path: str) -> abi.FileKey | None:
    """How BPF maps name the file at `path` (the kernel's dev_t, inode); None if none."""
    stamp = file_stamp(path)
    return None if stamp is None else abi.FileKey(ino=stamp.ino, dev=stamp.kernel_dev)


def names_file(path: str, dev: int, ino: int) -> bool:
    """Whether `path` is the file (kernel dev_t, inode) here: a path from another
    process's /proc/PID/maps may name another file in this mount namespace, or none."""
    here = file_key(path)
    return here is not None and (here.dev, here.ino) == (dev, ino)


_OWN = {"/proc/self/": "", "/proc/thread-self/": "", "/dev/fd/": "fd/"}


def process_path(path: str, tgid: int) -> str:
    """A file name a traced process gave (ld.so's name of a library it dlopen()ed, an
    exec's), as refcntd must open it: `/proc/self/fd/9` and `/dev/fd/9` mean the
    process's descriptor, which in refcntd's own process is another file, `/proc/TGID/fd/9`
    here."""
    for own, under in _OWN.items():
        if path.startswith(own):
            return f"/proc/{tgid}/{under}{path[len(own):]}"
    return path


def pack_probe_cfgs(sites: list[ProbeSite], type_ids: Callable[[str], int]) -> bytes:
    """probe_cfgs' rows for `sites`, in order (no kernel needed)."""
    return b"".join(bytes(probe_cfg(site, type_ids)) for site in sites)


def probe_cfg(site: ProbeSite, type_ids: Callable[[str], int]) -> abi.ProbeCfg:
    role = site.spec_role
    cfg = abi.ProbeCfg(role=Role[site.role.upper()].value, caller_sp=site.caller_sp_offset,
                          is_return=int(site.is_return), obj=_arg_loc(site.obj_loc),
                          cond=site.site_cond)
    if site.type_loc is not None:
        cfg.type = _arg_loc(site.type_loc)
    elif role.type_name is not None and role.type_name.constant is not None:
        cfg.fixed_type = type_ids(str(role.type_name.constant))
    if site.count_loc is not None:
        cfg.count = _arg_loc(site.count_loc)
    elif role.initial_count is not None and role.initial_count.constant is not None:
        cfg.fixed_count = int(role.initial_count.constant)
    _semantics(cfg, site)
    return cfg


def _semantics(cfg: abi.ProbeCfg, site: ProbeSite) -> None:
    """The spec's per-role behaviour (docs/specs.md) as probe flags."""
    role = site.spec_role
    cfg.flags = ((abi.PF_FREES_AT_ZERO if role.frees_at_zero else 0)
                 | (abi.PF_DELETE_IN_PUT if role.inside_last_put == "before" else 0)
                 | (abi.PF_ABSORBS_PUT if role.absorbs_put else 0)
                 | (abi.PF_OBJ_OUT if role.obj.out else 0)
                 | (abi.PF_STATIC_IF if role.static_if else 0)
                 | (abi.PF_QUIET_UNKNOWN if role.quiet_unknown else 0)
                 | (abi.PF_MAY_LEAK_FLAG if role.may_be_leaked else 0)
                 | (abi.PF_REVIVE if role.revives else 0)
                 | _existing_flags(role))
    if role.type_name is not None:
        for i, offset in enumerate(role.type_name.deref):
            cfg.type_deref[i] = offset + 1
    if role.floating_flag is not None:
        cfg.flag_offset, cfg.flag_mask = role.floating_flag
    if role.static_if is not None:
        cfg.static_offset, cfg.static_value = role.static_if
    if role.may_be_leaked is not None:
        cfg.kept_offset, cfg.kept_mask = role.may_be_leaked


def _existing_flags(role: RoleSpec) -> int:
    """may_return_existing: a live object returned is that object (a get, or no change)."""
    existing = role.may_return_existing
    if existing is None:
        return 0
    return (abi.PF_MAY_EXIST | (abi.PF_EXISTING_GET if existing.get else 0)
            | (abi.PF_REUSES_ARG if existing.reused_arg else 0))


def _arg_loc(loc: ArgLoc) -> abi.ArgLoc:
    return abi.ArgLoc(kind=loc.kind, size=loc.size, is_signed=int(loc.signed),
                         reg_off=loc.reg_offset, value=loc.value)


def decode_stack(value: abi.StackRec) -> StackRecord:
    nr = min(value.nr, abi.STACK_DEPTH)
    frames = []
    for frame in value.frame[:nr]:
        build_id = bytes(frame.build_id).hex() if frame.status == 1 else None
        file = None
        if frame.status in (abi.FRAME_FILE, abi.FRAME_EXE_TEXT):
            ino, dev = struct.unpack_from("<QI", bytes(frame.build_id))
            file = (dev, ino)
        frames.append(RawFrame(build_id, frame.offset_or_ip if frame.status else 0, file,
                               frame.status == abi.FRAME_EXE_TEXT))
    return StackRecord(tuple(value.ip[:nr]), tuple(frames), UnwindMethod(value.method),
                       Truncation(value.truncated), value.truncated_at)


def decode_event(raw: abi.Event) -> LifecycleEvent:
    argv = tuple(_argv_slot(bytes(raw.argv[i]))
                 for i in range(min(raw.argc, abi.ARGV_SLOTS)))
    return LifecycleEvent(EventKind(raw.kind), raw.tgid, raw.pid, raw.gen, raw.ts,
                          raw.exit_code, raw.comm.decode(errors="replace"),
                          raw.path.decode(errors="replace"), argv)


def decode_anomaly(raw: abi.Anomaly, type_name: Callable[[int], str]) -> AnomalyRecord:
    where = StackRef(raw.stack_id, raw.caller_ip)
    alloc = (StackRef(raw.alloc_stack_id, raw.alloc_caller_ip)
             if raw.alloc_stack_id or raw.init_ns else None)
    return AnomalyRecord(AnomalyKind(raw.anomaly), raw.tgid, raw.tid, raw.gen, raw.ts, raw.addr,
                         raw.count_before, type_name(raw.type_id), raw.name_ptr, where, alloc,
                         raw.init_ns, raw.released_ns)


def _argv_slot(raw: bytes) -> str:
    """One argv string; a slot filled to the end was cut short, and says so."""
    text = raw.split(b"\0", 1)[0]
    suffix = "..." if len(text) >= abi.ARGV_LEN - 1 else ""
    return text.decode(errors="replace") + suffix


AGE_FINE_HORIZON_NS = abi.AGE_FINE_HORIZON_S * 10**9  # older objects: coarse bins only
AGE_FINE_WINDOW_NS = AGE_FINE_HORIZON_NS - 10 * 10**9  # fine bins read: surely complete
AGE_COARSE_KEEP_NS = 3600 * 10**9  # empty coarse bins older than this are removed
AgeRow = tuple[int, int, int, int, int, int]  # tgid, gen, type_id, name_ptr, bin, count
Who = tuple[int, int, int, int]  # tgid, gen, type_id, name_ptr


def site_live(k: Any, v: Any, names: dict[int, str], since: int, since_mean: int
               ) -> SiteLive:
    return SiteLive(k.tgid, k.gen, names.get(k.type_id, "") if k.type_id else "", k.name_ptr,
                    StackRef(k.stack_id, k.caller_ip), max(0, v.live), v.created, since,
                    since_mean, (v.created, v.gets, v.puts, v.released))


def age_view(rows: list[AgeRow], now_ns: int) -> tuple[list[tuple[Who, int, int, int]],
                                                        list[int]]:
    """The age_bins map as (who, start_ns, end_ns, live objects) and the rows to delete.

    Every object is in a coarse bin (~2 min); those of the last AGE_FINE_WINDOW are
    also in a fine bin (~1 s), read instead.  A fine bin is dropped once no increment
    can reach it (the kernel counts no fine bin for an object older than its horizon),
    an empty coarse bin an hour after it ended."""
    fine_from = (now_ns - AGE_FINE_WINDOW_NS) >> abi.AGE_FINE_SHIFT  # complete after it
    coarse: dict[tuple[Who, int], int] = {}
    fine: list[tuple[Who, int, int]] = []
    doomed = []
    for i, (tgid, gen, type_id, name_ptr, b, count) in enumerate(rows):
        who = (tgid, gen, type_id, name_ptr)
        if b & abi.AGE_COARSE:
            start = (b & ~abi.AGE_COARSE) << abi.AGE_COARSE_SHIFT
            if count <= 0 and start + (1 << abi.AGE_COARSE_SHIFT) < now_ns - AGE_COARSE_KEEP_NS:
                doomed.append(i)
            else:
                coarse[(who, start)] = count
        elif b > fine_from:
            fine.append((who, b << abi.AGE_FINE_SHIFT, count))
        elif (b + 2) << abi.AGE_FINE_SHIFT < now_ns - AGE_FINE_HORIZON_NS:
            doomed.append(i)
    out = []
    for who, start, count in fine:  # the coarse bins keep what the fine ones do not
        c_start = start >> abi.AGE_COARSE_SHIFT << abi.AGE_COARSE_SHIFT
        if (who, c_start) in coarse:
            coarse[(who, c_start)] -= count
        if count > 0:
            out.append((who, start, start + (1 << abi.AGE_FINE_SHIFT), count))
    cut = (fine_from + 1) << abi.AGE_FINE_SHIFT  # fine bins from here on
    for (who, start), count in coarse.items():
        if count > 0:
            out.append((who, start, min(start + (1 << abi.AGE_COARSE_SHIFT), cut), count))
    return out, doomed


def decode_object(key: abi.ObjKey, val: abi.ObjVal, names: dict[int, str],
                   history: HistoryRecord | None = None) -> ObjectRecord:
    type_name = names.get(val.type_id, "") if val.type_id else ""
    return ObjectRecord(key.tgid, val.gen, key.addr, val.count, type_name, val.init_ns,
                        val.stack_id, val.caller_ip, val.name_ptr, val.gets,
                        val.puts, history)


def decode_history(value: ctypes.Structure, depth: int,
                    sites: tuple[SiteCount, ...]) -> HistoryRecord:
    kept = min(value.n, depth)
    events = tuple(HistoryEvent(Role(e.op), e.count_after,
                                StackRef(e.stack_id, e.caller_ip), e.ts)
                   for e in value.e[:kept])
    return HistoryRecord(value.n, events, sites, value.paths_lost)
