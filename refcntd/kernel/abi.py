"""The kernel ABI, generated from bpf/refcntd.h by refcntd/kernel/abigen.py.

Do not edit: change the header and run `python -m refcntd.kernel.abigen`.
"""

from __future__ import annotations

import ctypes as C
from enum import IntEnum

TYPE_NAME_LEN = 32
STACK_DEPTH = 48
ARGV_SLOTS = 8
ARGV_LEN = 128
PATH_LEN = 128
LINK_MAP_MAX = 64
FNV_OFFSET = 2166136261
FNV_PRIME = 16777619
PF_FREES_AT_ZERO = 1
PF_DELETE_IN_PUT = 2
PF_OBJ_OUT = 4
PF_STATIC_IF = 8
PF_QUIET_UNKNOWN = 16
PF_MAY_LEAK_FLAG = 32
PF_REVIVE = 64
PF_MAY_EXIST = 128
PF_EXISTING_GET = 256
PF_REUSES_ARG = 512
PF_ABSORBS_PUT = 1024
HISTORY_DEPTH = 256
HISTORY_SITES = 8
AGE_FINE_SHIFT = 30
AGE_COARSE_SHIFT = 37
AGE_COARSE = 2147483648
AGE_FINE_HORIZON_S = 600
MAX_EXEC_MAPS = 32
CFI_SEARCH_STEPS = 24
MOD_FP = 1
FRAME_FILE = 3
FRAME_EXE_TEXT = 4
PROC_IGNORED = 1
PROC_HAS_OBJECTS = 2


class Role(IntEnum):
    INIT = 0
    GET = 1
    PUT = 2
    DELETE = 3
    INIT_ENTRY = 4
    SINK = 5
    CHECK = 6
    OFF = 7


ROLE_TEXT: dict[Role, str] = {
    Role.INIT_ENTRY: "saves a constructor's arguments for its return probe",
    Role.SINK: "ref_sink: a get unless the object's floating flag is set",
    Role.CHECK: 'changes no count: reads the object\'s "may be leaked" flag',
    Role.OFF: 'a call site of a function moved back to its entry probe',
}


class Stat(IntEnum):
    OBJ_MAP_FULL = 0
    STACK_LOST = 1
    STACK_COLLISION = 2
    UNKNOWN_GET = 3
    UNKNOWN_PUT = 4
    UNKNOWN_DELETE = 5
    REINIT_LIVE = 6
    STALE_REPLACED = 7
    EVENT_LOST = 8
    PROC_MAP_FULL = 9
    CALLER_UNREAD = 10
    PUT_BELOW_ZERO = 11
    TYPE_MAP_FULL = 12
    STACK_UNREAD = 13
    INIT_ARGS_LOST = 14
    HISTORY_MAP_FULL = 15
    SITES_MAP_FULL = 16
    FLOATING_SUNK = 17
    STATIC_SKIPPED = 18
    MAY_BE_LEAKED = 19
    REVIVED = 20
    TRUNC_NO_TABLE = 21
    TRUNC_UNREADABLE = 22
    TRUNC_DEPTH = 23
    TRUNC_OUTSIDE = 24
    TRUNC_BAD_RULE = 25
    EXEC_MAPS_FULL = 26
    PROC_STATS_FULL = 27
    PATHS_MAP_FULL = 28
    PATHS_STALE = 29
    ALLOC_SITES_FULL = 30
    AGE_BINS_FULL = 31
    EXISTING_RETURNED = 32
    REUSE_DROPPED = 33


STAT_TEXT: dict[Stat, str] = {
    Stat.OBJ_MAP_FULL: 'loss: inits not recorded: object map full',
    Stat.STACK_LOST: 'loss: stacks not recorded: stack store full',
    Stat.STACK_COLLISION: 'loss: stacks not recorded: two different stacks had the same 64-bit hash',
    Stat.UNKNOWN_GET: 'note: gets on objects never seen initialised (created before tracing began, or by a function the spec does not name)',
    Stat.UNKNOWN_PUT: 'note: puts on objects never seen initialised',
    Stat.UNKNOWN_DELETE: 'note: deletes of objects never seen initialised',
    Stat.REINIT_LIVE: 'loss: objects re-initialised at a live address (earlier record replaced)',
    Stat.STALE_REPLACED: 'loss: records of an exited process replaced before they were drained',
    Stat.EVENT_LOST: 'loss: lifecycle events lost: ring buffer full',
    Stat.PROC_MAP_FULL: 'loss: processes not traced: process table full',
    Stat.CALLER_UNREAD: 'loss: callers of init not read',
    Stat.PUT_BELOW_ZERO: 'note: puts on a count already at or below zero (see the anomalies)',
    Stat.TYPE_MAP_FULL: 'loss: type names not recorded: type table full',
    Stat.STACK_UNREAD: 'loss: stacks not recorded: the user stack could not be read',
    Stat.INIT_ARGS_LOST: 'loss: constructors returned without the arguments saved at entry',
    Stat.HISTORY_MAP_FULL: 'loss: objects without a get/put history: history map full',
    Stat.SITES_MAP_FULL: "loss: released objects' get/put paths not recorded: site map full (culprits may miss a baseline)",
    Stat.FLOATING_SUNK: 'note: floating references sunk (ref_sink on a floating object: no count change)',
    Stat.STATIC_SKIPPED: "note: operations on the library's static objects, not counted (spec: static_if)",
    Stat.MAY_BE_LEAKED: 'note: objects the library flags "may be leaked", set aside (spec: may_be_leaked)',
    Stat.REVIVED: 'note: objects kept alive by their dispose after their last put (spec: revives)',
    Stat.TRUNC_NO_TABLE: 'note: stacks cut at a module with neither frame pointers nor an unwind table',
    Stat.TRUNC_UNREADABLE: 'note: stacks cut where the user stack could not be read',
    Stat.TRUNC_DEPTH: 'note: stacks cut at the depth limit',
    Stat.TRUNC_OUTSIDE: 'note: stacks cut at a return address outside every executable mapping',
    Stat.TRUNC_BAD_RULE: 'note: stacks cut at an unwind rule the BPF unwinder does not follow',
    Stat.EXEC_MAPS_FULL: 'note: executable mappings not remembered (more than MAX_EXEC_MAPS in a process): frames there stay unplaced',
    Stat.PROC_STATS_FULL: 'loss: counts not kept per process: per-process table full (process reports may miss their own counts; the totals are exact)',
    Stat.PATHS_MAP_FULL: 'loss: get/put operations of objects with history not counted per path: path map full (their culprits are reported unknown)',
    Stat.PATHS_STALE: 'note: per-path counts of released objects with more than 8 paths kept until their process is reported',
    Stat.ALLOC_SITES_FULL: 'note: objects not counted per allocation site: site table full (live counts, metrics and diffs leave them out)',
    Stat.AGE_BINS_FULL: 'note: objects not counted by creation time: age table full (the age metrics leave them out)',
    Stat.EXISTING_RETURNED: 'note: constructors that returned an object already live: no new object (spec: may_return_existing)',
    Stat.REUSE_DROPPED: 'note: objects a constructor was given to reuse and dropped (it failed: a put; spec: may_return_existing)',
}


class EventKind(IntEnum):
    PROC = 1
    FORK = 2
    EXECVE = 3
    EXIT = 4
    THREAD_GONE = 5
    LIBRARY = 6
    ANOMALY = 7
    HOLD = 8


EVENTKIND_TEXT: dict[EventKind, str] = {
    EventKind.HOLD: 'a process stopped until user space scanned a new module',
}


class AnomalyKind(IntEnum):
    DOUBLE_PUT = 1
    NEGATIVE_COUNT = 2
    PUT_AFTER_DELETE = 3
    GET_AFTER_DELETE = 4
    DELETE_LIVE = 5
    DOUBLE_DELETE = 6
    UNKNOWN_GET = 7
    UNKNOWN_PUT = 8
    UNKNOWN_DELETE = 9


ANOMALYKIND_TEXT: dict[AnomalyKind, str] = {
    AnomalyKind.DOUBLE_PUT: 'put on a live object whose count was already 0',
    AnomalyKind.NEGATIVE_COUNT: 'put on a live object whose count was already below 0',
    AnomalyKind.PUT_AFTER_DELETE: 'put on a deleted / released object',
    AnomalyKind.GET_AFTER_DELETE: 'get on a deleted / released object (use after put)',
    AnomalyKind.DELETE_LIVE: 'delete while the count is not 0',
    AnomalyKind.DOUBLE_DELETE: 'delete of an already deleted object',
    AnomalyKind.UNKNOWN_GET: 'get on an object never seen initialised',
}


class LocKind(IntEnum):
    NONE = 0
    REG = 1
    MEM = 2
    IMM = 3


class UnwindMethod(IntEnum):
    NONE = 0
    FP = 1
    CFI = 2
    MIXED = 3


UNWINDMETHOD_TEXT: dict[UnwindMethod, str] = {
    UnwindMethod.FP: 'frame pointers',
    UnwindMethod.CFI: 'CFI unwind tables',
    UnwindMethod.MIXED: 'frame pointers and CFI',
}


class Truncation(IntEnum):
    NONE = 0
    NO_TABLE = 1
    UNREADABLE = 2
    DEPTH = 3
    OUTSIDE = 4
    BAD_RULE = 5


TRUNCATION_TEXT: dict[Truncation, str] = {
    Truncation.NO_TABLE: 'the module has neither frame pointers nor an unwind table',
    Truncation.UNREADABLE: 'the user stack could not be read there',
    Truncation.DEPTH: 'depth limit',
    Truncation.OUTSIDE: 'the next return address is outside every executable mapping',
    Truncation.BAD_RULE: 'the unwind rule there is not one the BPF unwinder follows',
}


class CfaRule(IntEnum):
    NONE = 0
    RSP = 1
    RBP = 2
    PLT = 3
    BAD = 4
    END = 5


CFARULE_TEXT: dict[CfaRule, str] = {
    CfaRule.NONE: 'no FDE covers the pc',
    CfaRule.PLT: 'the x86-64 PLT expression',
    CfaRule.BAD: 'a rule the BPF unwinder does not follow',
    CfaRule.END: 'return address undefined: the outermost frame',
}


class BpfStackBuildId(C.Structure):
    _fields_ = [
        ("status", C.c_int32),
        ("build_id", (C.c_ubyte * 20)),
        ("offset_or_ip", C.c_uint64),
    ]


class ArgLoc(C.Structure):
    _fields_ = [
        ("kind", C.c_uint8),
        ("size", C.c_uint8),
        ("is_signed", C.c_uint8),
        ("pad", C.c_uint8),
        ("reg_off", C.c_uint16),
        ("pad2", C.c_uint16),
        ("pad3", C.c_uint32),
        ("value", C.c_int64),
    ]


class ProbeCfg(C.Structure):
    _fields_ = [
        ("role", C.c_uint32),
        ("caller_sp", C.c_int32),
        ("fixed_count", C.c_int32),
        ("fixed_type", C.c_uint32),
        ("is_return", C.c_uint32),
        ("cond", C.c_uint32),
        ("flags", C.c_uint32),
        ("obj", ArgLoc),
        ("type", ArgLoc),
        ("count", ArgLoc),
        ("type_deref", (C.c_uint32 * 2)),
        ("flag_offset", C.c_uint32),
        ("flag_mask", C.c_uint32),
        ("static_offset", C.c_uint32),
        ("static_value", C.c_int32),
        ("kept_offset", C.c_uint32),
        ("kept_mask", C.c_uint32),
    ]


class HistEntry(C.Structure):
    _fields_ = [
        ("op", C.c_uint32),
        ("count_after", C.c_int32),
        ("pad", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
        ("ts", C.c_uint64),
    ]


class HistPath(C.Structure):
    _fields_ = [
        ("op", C.c_uint32),
        ("pad", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
    ]


def hist_val_type(history_depth: int = 256) -> type[C.Structure]:
    """struct hist_val with HISTORY_DEPTH as given; the default is the header's, as compiled."""
    return type("HistVal", (C.Structure,), {"_fields_": [
        ("n", C.c_uint64),
        ("serial", C.c_uint64),
        ("npaths", C.c_uint64),
        ("paths_lost", C.c_uint64),
        ("path", (HistPath * HISTORY_SITES)),
        ("e", (HistEntry * history_depth)),
    ]})


class PathKey(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("op", C.c_uint32),
        ("addr", C.c_uint64),
        ("serial", C.c_uint64),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
    ]


class PathVal(C.Structure):
    _fields_ = [
        ("count", C.c_uint64),
        ("first_ns", C.c_uint64),
        ("last_ns", C.c_uint64),
    ]


class ProcStack(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("pad", C.c_uint32),
        ("stack_id", C.c_uint64),
    ]


class SiteKey(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("type_id", C.c_uint32),
        ("op", C.c_uint32),
        ("pad", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
        ("name_ptr", C.c_uint64),
    ]


class InitArgs(C.Structure):
    _fields_ = [
        ("type_ptr", C.c_uint64),
        ("count", C.c_int64),
        ("out_ptr", C.c_uint64),
        ("existing", C.c_uint64),
    ]


class ProcStatKey(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("stat", C.c_uint32),
    ]


class ObjKey(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("pad", C.c_uint32),
        ("addr", C.c_uint64),
    ]


class ObjVal(C.Structure):
    _fields_ = [
        ("count", C.c_int64),
        ("gets", C.c_uint32),
        ("puts", C.c_uint32),
        ("gen", C.c_uint32),
        ("type_id", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("init_ns", C.c_uint64),
        ("caller_ip", C.c_uint64),
        ("name_ptr", C.c_uint64),
        ("since_cp", C.c_uint64),
    ]


class GraveVal(C.Structure):
    _fields_ = [
        ("type_id", C.c_uint32),
        ("gen", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
        ("name_ptr", C.c_uint64),
        ("init_ns", C.c_uint64),
        ("released_ns", C.c_uint64),
    ]


class Anomaly(C.Structure):
    _fields_ = [
        ("kind", C.c_uint32),
        ("tgid", C.c_uint32),
        ("tid", C.c_uint32),
        ("anomaly", C.c_uint32),
        ("ts", C.c_uint64),
        ("addr", C.c_uint64),
        ("count_before", C.c_int64),
        ("type_id", C.c_uint32),
        ("gen", C.c_uint32),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
        ("alloc_stack_id", C.c_uint64),
        ("alloc_caller_ip", C.c_uint64),
        ("name_ptr", C.c_uint64),
        ("init_ns", C.c_uint64),
        ("released_ns", C.c_uint64),
    ]


class AllocSite(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("gen", C.c_uint32),
        ("type_id", C.c_uint32),
        ("pad", C.c_uint32),
        ("name_ptr", C.c_uint64),
        ("stack_id", C.c_uint64),
        ("caller_ip", C.c_uint64),
    ]


class AllocCount(C.Structure):
    _fields_ = [
        ("live", C.c_int64),
        ("created", C.c_uint64),
        ("gets", C.c_uint64),
        ("puts", C.c_uint64),
        ("released", C.c_uint64),
    ]


class SinceKey(C.Structure):
    _fields_ = [
        ("site", AllocSite),
        ("cp", C.c_uint64),
    ]


class SinceCount(C.Structure):
    _fields_ = [
        ("live", C.c_int64),
        ("age_sum", C.c_int64),
    ]


class AgeKey(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("gen", C.c_uint32),
        ("type_id", C.c_uint32),
        ("bin", C.c_uint32),
        ("name_ptr", C.c_uint64),
    ]


class StackRec(C.Structure):
    _fields_ = [
        ("tgid", C.c_uint32),
        ("gen", C.c_uint32),
        ("nr", C.c_uint32),
        ("method", C.c_uint16),
        ("truncated", C.c_uint16),
        ("truncated_at", C.c_uint32),
        ("pad", C.c_uint32),
        ("ip", (C.c_uint64 * STACK_DEPTH)),
        ("frame", (BpfStackBuildId * STACK_DEPTH)),
    ]


class CfiRow(C.Structure):
    _fields_ = [
        ("pc", C.c_uint32),
        ("cfa_off", C.c_int32),
        ("rbp_off", C.c_int16),
        ("cfa", C.c_uint8),
        ("pad", C.c_uint8),
    ]


class FileKey(C.Structure):
    _fields_ = [
        ("ino", C.c_uint64),
        ("dev", C.c_uint32),
        ("pad", C.c_uint32),
    ]


class HoldKey(C.Structure):
    _fields_ = [
        ("file", FileKey),
        ("offset", C.c_uint64),
    ]


class CfiModule(C.Structure):
    _fields_ = [
        ("first", C.c_uint32),
        ("count", C.c_uint32),
        ("flags", C.c_uint32),
        ("text_off", C.c_uint32),
        ("build_id", (C.c_uint8 * 20)),
        ("pad", C.c_uint32),
    ]


class ExecMap(C.Structure):
    _fields_ = [
        ("start", C.c_uint64),
        ("end", C.c_uint64),
        ("pgoff", C.c_uint64),
        ("file", FileKey),
    ]


class ExecMaps(C.Structure):
    _fields_ = [
        ("n", C.c_uint32),
        ("pad", C.c_uint32),
        ("m", (ExecMap * MAX_EXEC_MAPS)),
    ]


class MmapArgs(C.Structure):
    _fields_ = [
        ("len", C.c_uint64),
        ("off", C.c_uint64),
        ("fd", C.c_int32),
        ("pad", C.c_uint32),
    ]


class RefcntdConfig(C.Structure):
    _fields_ = [
        ("filtered", C.c_uint8),
        ("has_delete", C.c_uint8),
        ("filter_comm", C.c_uint8),
        ("unwind", C.c_uint8),
        ("hold", C.c_uint8),
        ("sites", C.c_uint8),
        ("history", C.c_uint8),
        ("history_all", C.c_uint8),
        ("history_depth", C.c_uint32),
        ("exit_code_off", C.c_int32),
        ("cgroup_id", C.c_uint64),
        ("off_task_mm", C.c_uint32),
        ("off_task_files", C.c_uint32),
        ("off_mm_start_code", C.c_uint32),
        ("off_mm_end_code", C.c_uint32),
        ("off_mm_exe_file", C.c_uint32),
        ("off_files_fdt", C.c_uint32),
        ("off_fdt_fd", C.c_uint32),
        ("off_file_inode", C.c_uint32),
        ("off_inode_ino", C.c_uint32),
        ("off_inode_sb", C.c_uint32),
        ("off_sb_dev", C.c_uint32),
        ("hold_tables", C.c_uint8),
        ("hold_execs", C.c_uint8),
        ("absorbs_put", C.c_uint8),
        ("filter_exe", C.c_uint8),
        ("off_task_utask", C.c_uint32),
        ("off_utask_ri", C.c_uint32),
        ("off_ri_stack", C.c_uint32),
        ("off_ri_orig_ret", C.c_uint32),
        ("off_ri_next", C.c_uint32),
        ("off_mm_uprobes", C.c_uint32),
        ("off_uprobes_xol", C.c_uint32),
        ("off_xol_vaddr", C.c_uint32),
        ("off_task_signal", C.c_int32),
        ("off_signal_live", C.c_int32),
    ]


class CommKey(C.Structure):
    _fields_ = [
        ("comm", (C.c_char * 16)),
    ]


class ProcVal(C.Structure):
    _fields_ = [
        ("gen", C.c_uint32),
        ("flags", C.c_uint32),
        ("start_ns", C.c_uint64),
    ]


class TypeName(C.Structure):
    _fields_ = [
        ("name", (C.c_char * TYPE_NAME_LEN)),
    ]


class TypeTotals(C.Structure):
    _fields_ = [
        ("inits", C.c_uint64),
        ("gets", C.c_uint64),
        ("puts", C.c_uint64),
        ("released", C.c_uint64),
    ]


class Event(C.Structure):
    _fields_ = [
        ("kind", C.c_uint32),
        ("tgid", C.c_uint32),
        ("pid", C.c_uint32),
        ("gen", C.c_uint32),
        ("ts", C.c_uint64),
        ("exit_code", C.c_int32),
        ("argc", C.c_uint32),
        ("comm", (C.c_char * 16)),
        ("path", (C.c_char * PATH_LEN)),
        ("argv", ((C.c_char * ARGV_LEN) * ARGV_SLOTS)),
    ]


STRUCTS: dict[str, type[C.Structure]] = {
    "bpf_stack_build_id": BpfStackBuildId,
    "arg_loc": ArgLoc,
    "probe_cfg": ProbeCfg,
    "hist_entry": HistEntry,
    "hist_path": HistPath,
    "path_key": PathKey,
    "path_val": PathVal,
    "proc_stack": ProcStack,
    "site_key": SiteKey,
    "init_args": InitArgs,
    "proc_stat_key": ProcStatKey,
    "obj_key": ObjKey,
    "obj_val": ObjVal,
    "grave_val": GraveVal,
    "anomaly": Anomaly,
    "alloc_site": AllocSite,
    "alloc_count": AllocCount,
    "since_key": SinceKey,
    "since_count": SinceCount,
    "age_key": AgeKey,
    "stack_rec": StackRec,
    "cfi_row": CfiRow,
    "file_key": FileKey,
    "hold_key": HoldKey,
    "cfi_module": CfiModule,
    "exec_map": ExecMap,
    "exec_maps": ExecMaps,
    "mmap_args": MmapArgs,
    "refcntd_config": RefcntdConfig,
    "comm_key": CommKey,
    "proc_val": ProcVal,
    "type_name": TypeName,
    "type_totals": TypeTotals,
    "event": Event,
}

# name -> (key type, value type, size as declared) of every map in bpf/
MAPS: dict[str, tuple[str, str, str]] = {
    "age_bins": ("age_key", "__s64", "MAX_AGE_BINS"),
    "alloc_sites": ("alloc_site", "alloc_count", "MAX_ALLOC_SITES"),
    "anomaly_buf": ("int", "anomaly", "1"),
    "cfi_modules": ("file_key", "cfi_module", "MAX_MODULES"),
    "cfi_rows": ("int", "cfi_row", "MAX_CFI_ROWS"),
    "checkpoint": ("int", "__u64", "1"),
    "comm_allow": ("comm_key", "__u32", "64"),
    "config": ("int", "refcntd_config", "1"),
    "ctor_depth": ("__u32", "__u32", "MAX_PROCS"),
    "early_ops": ("obj_key", "__s64", "MAX_PROCS"),
    "events": ("", "", "RINGBUF_PAGES"),
    "exe_allow": ("file_key", "__u32", "64"),
    "exec_maps": ("__u32", "exec_maps", "MAX_PROCS"),
    "fork_parent": ("__u32", "__u32", "MAX_PROCS"),
    "gen_counter": ("int", "__u64", "1"),
    "graveyard": ("obj_key", "grave_val", "MAX_GRAVES"),
    "held": ("__u32", "hold_key", "MAX_HELD"),
    "hist_paths": ("path_key", "path_val", "MAX_PATHS"),
    "hist_zero": ("int", "hist_val", "1"),
    "history": ("obj_key", "hist_val", "MAX_HISTORY"),
    "history_types": ("__u32", "__u32", "256"),
    "hold_funcs": ("hold_key", "__u32", "256"),
    "hold_owners": ("file_key", "__u32", "64"),
    "last_released": ("__u32", "obj_key", "MAX_PROCS"),
    "maps_scratch": ("int", "exec_maps", "1"),
    "may_leak": ("obj_key", "__u32", "MAX_GRAVES"),
    "name_buf": ("int", "type_name", "1"),
    "objs": ("obj_key", "obj_val", "MAX_OBJECTS"),
    "pending_init": ("__u64", "init_args", "MAX_PROCS"),
    "pending_mmap": ("__u32", "mmap_args", "MAX_MMAP_CALLS"),
    "probe_cfgs": ("int", "probe_cfg", "MAX_PROBES"),
    "probe_hits": ("int", "__u64", "MAX_PROBES"),
    "probe_progs": ("int", "int", "3"),
    "probe_stack": ("int", "__u64", "1"),
    "proc_stacks": ("proc_stack", "__u32", "MAX_STACKS"),
    "proc_stats": ("proc_stat_key", "__u64", "MAX_PROC_STATS"),
    "procs": ("__u32", "proc_val", "MAX_PROCS"),
    "put_due": ("obj_key", "__u32", "MAX_PROCS"),
    "released_sites": ("site_key", "__u64", "MAX_SITES"),
    "scratch": ("int", "event", "1"),
    "since": ("since_key", "since_count", "MAX_ALLOC_SITES"),
    "stack_scratch": ("int", "stack_rec", "1"),
    "stack_store": ("__u64", "stack_rec", "MAX_STACKS"),
    "stats": ("int", "__u64", "ST_COUNT"),
    "table_owners": ("file_key", "__u32", "64"),
    "totals": ("__u32", "type_totals", "MAX_TYPES"),
    "types": ("__u32", "type_name", "MAX_TYPES"),
    "unknown_seen": ("obj_key", "__u32", "MAX_GRAVES"),
    "unwind_states": ("int", "unwind_state", "1"),
    "vetted": ("file_key", "__u32", "MAX_VETTED"),
}
