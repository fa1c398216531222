"""Python mirror of bpf/refcntd.h.  kernel.py checks these sizes at load time."""

from __future__ import annotations

import ctypes as C
from enum import IntEnum

TYPE_NAME_LEN = 32
STACK_DEPTH = 48
ARGV_SLOTS = 8
ARGV_LEN = 128
PATH_LEN = 128


class Role(IntEnum):
    INIT = 0
    GET = 1
    PUT = 2
    DELETE = 3
    INIT_ENTRY = 4


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
    RAW_STACK_LOST = 13
    INIT_ARGS_LOST = 14
    HISTORY_MAP_FULL = 15
    SITES_MAP_FULL = 16


STAT_COUNT = len(Stat)


class EventKind(IntEnum):
    PROC = 1
    FORK = 2
    EXECVE = 3
    EXIT = 4
    THREAD_GONE = 5
    LIBRARY = 6
    ANOMALY = 7


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


class ArgLoc(C.Structure):
    _fields_ = [("kind", C.c_uint8), ("size", C.c_uint8), ("is_signed", C.c_uint8),
                ("pad", C.c_uint8), ("reg_off", C.c_uint16), ("pad2", C.c_uint16),
                ("pad3", C.c_uint32), ("value", C.c_int64)]


class ProbeCfg(C.Structure):
    _fields_ = [("role", C.c_uint32), ("caller_sp", C.c_int32), ("fixed_count", C.c_int32),
                ("fixed_type", C.c_uint32), ("is_return", C.c_uint32), ("pad", C.c_uint32),
                ("obj", ArgLoc), ("type", ArgLoc), ("count", ArgLoc)]


class ObjKey(C.Structure):
    _fields_ = [("tgid", C.c_uint32), ("pad", C.c_uint32), ("addr", C.c_uint64)]


class ObjVal(C.Structure):
    _fields_ = [("count", C.c_int64), ("gets", C.c_uint32), ("puts", C.c_uint32),
                ("gen", C.c_uint32), ("type_id", C.c_uint32), ("stack_id", C.c_int32),
                ("raw_stack_id", C.c_int32), ("init_ns", C.c_uint64),
                ("caller_ip", C.c_uint64), ("name_ptr", C.c_uint64)]


class ProcVal(C.Structure):
    _fields_ = [("gen", C.c_uint32), ("flags", C.c_uint32), ("start_ns", C.c_uint64)]


class GraveVal(C.Structure):
    _fields_ = [("type_id", C.c_uint32), ("gen", C.c_uint32), ("stack_id", C.c_int32),
                ("raw_stack_id", C.c_int32), ("caller_ip", C.c_uint64), ("name_ptr", C.c_uint64),
                ("init_ns", C.c_uint64), ("released_ns", C.c_uint64)]


class Anomaly(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("tgid", C.c_uint32), ("tid", C.c_uint32),
                ("anomaly", C.c_uint32), ("ts", C.c_uint64), ("addr", C.c_uint64),
                ("count_before", C.c_int64), ("type_id", C.c_uint32), ("gen", C.c_uint32),
                ("stack_id", C.c_int32), ("raw_stack_id", C.c_int32), ("caller_ip", C.c_uint64),
                ("alloc_stack_id", C.c_int32), ("alloc_raw_stack_id", C.c_int32),
                ("alloc_caller_ip", C.c_uint64), ("name_ptr", C.c_uint64),
                ("init_ns", C.c_uint64), ("released_ns", C.c_uint64)]


HISTORY_SITES = 8


class HistEntry(C.Structure):
    _fields_ = [("op", C.c_uint32), ("count_after", C.c_int32), ("stack_id", C.c_int32),
                ("raw_stack_id", C.c_int32), ("caller_ip", C.c_uint64), ("ts", C.c_uint64)]


class HistSite(C.Structure):
    _fields_ = [("op", C.c_uint32), ("stack_id", C.c_int32), ("raw_stack_id", C.c_int32),
                ("pad", C.c_uint32), ("caller_ip", C.c_uint64), ("count", C.c_uint64)]


def hist_val_type(depth: int) -> type[C.Structure]:
    """struct hist_val for a HISTORY_DEPTH chosen at compile time."""
    return type(f"HistVal{depth}", (C.Structure,), {"_fields_": [
        ("n", C.c_uint64), ("site_overflow", C.c_uint64),
        ("site", HistSite * HISTORY_SITES), ("e", HistEntry * depth)]})


class ProcStack(C.Structure):
    _fields_ = [("tgid", C.c_uint32), ("stack_id", C.c_int32), ("raw_stack_id", C.c_int32),
                ("pad", C.c_uint32)]


class SiteKey(C.Structure):
    _fields_ = [("tgid", C.c_uint32), ("type_id", C.c_uint32), ("op", C.c_uint32),
                ("stack_id", C.c_int32), ("raw_stack_id", C.c_int32), ("pad", C.c_uint32),
                ("caller_ip", C.c_uint64)]


class TypeName(C.Structure):
    _fields_ = [("name", C.c_char * TYPE_NAME_LEN)]


class TypeTotals(C.Structure):
    _fields_ = [("inits", C.c_uint64), ("gets", C.c_uint64), ("puts", C.c_uint64),
                ("released", C.c_uint64)]


class Event(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("tgid", C.c_uint32), ("pid", C.c_uint32),
                ("gen", C.c_uint32), ("ts", C.c_uint64), ("exit_code", C.c_int32),
                ("argc", C.c_uint32), ("comm", C.c_char * 16), ("path", C.c_char * PATH_LEN),
                ("argv", (C.c_char * ARGV_LEN) * ARGV_SLOTS)]


class BuildIdFrame(C.Structure):
    _fields_ = [("status", C.c_int32), ("build_id", C.c_ubyte * 20), ("offset_or_ip", C.c_uint64)]


class StackFrames(C.Structure):
    _fields_ = [("frame", BuildIdFrame * STACK_DEPTH)]


# map name -> (key type, value type) as the C side declares them
MAP_LAYOUT = {
    "probe_cfgs": (C.c_int32, ProbeCfg),
    "objs": (ObjKey, ObjVal),
    "procs": (C.c_uint32, ProcVal),
    "types": (C.c_uint32, TypeName),
    "stacks": (C.c_int32, StackFrames),
    "graveyard": (ObjKey, GraveVal),
    "proc_stacks": (ProcStack, C.c_uint32),
}
EVENT_SIZE = C.sizeof(Event)
