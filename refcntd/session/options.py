"""What a trace is asked for, and the BPF options it needs: known before the binary
analysis, so that the BPF compile can start first (cli/early.py).  Kept light:
attach's start waits for its imports."""

from __future__ import annotations

import os
from dataclasses import dataclass

from refcntd.errors import UsageError
from refcntd.inputs.spec import Spec
from refcntd.kernel import btf
from refcntd.kernel.program import KernelOptions


@dataclass(frozen=True)
class Credentials:
    """Who `run --user` runs CMD as: refcntd keeps its capabilities, CMD has none."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass
class TraceOptions:
    max_objects: int = 1 << 20
    max_stacks: int = 8192
    descendant_grace_s: float = 10.0
    history: tuple[str, ...] | None = None  # type names, ("all",), or None
    history_depth: int = 16
    comm_filter: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()  # system-wide: only processes running these (serve)
    cgroup_id: int | None = None
    sites: bool = False  # per-site live counts in the kernel (serve: scrapes and diffs)
    run_as: Credentials | None = None  # run --user
    scan_execs: bool = False  # run: probe the programs the tree execs that have the functions
    leak_kinds: bool = False  # hold each traced process at _exit for a reachability scan


def kernel_options(spec: Spec, has_ldso: bool, filtered: bool, opts: TraceOptions
                   ) -> KernelOptions:
    """What the BPF program is compiled for: known before the binary analysis ends."""
    return KernelOptions(filtered=filtered, has_delete=spec.has_delete,
                         absorbs_put=any(r.absorbs_put for r in spec.roles.get("put", ())),
                         max_objects=opts.max_objects, max_stacks=opts.max_stacks,
                         exit_code_offset=btf.member_offset("task_struct", "exit_code"),
                         history=opts.history, history_depth=opts.history_depth,
                         comm_filter=opts.comm_filter, exe_filter=bool(opts.programs),
                         cgroup_id=opts.cgroup_id,
                         sites=opts.sites, max_alloc_sites=_env_int(
                             "REFCNTD_MAX_ALLOC_SITES", 65536, 1 << 22),
                         unwind_offsets=None if os.environ.get("REFCNTD_UNWIND") == "fp"
                         else btf.unwind_offsets(), ringbuf_pages=ringbuf_pages())


def ringbuf_pages() -> int:
    """REFCNTD_RINGBUF_PAGES: the events ring buffer's size in pages (a power of 2; 1024,
    4 MiB, by default).  Smaller only to test that capture keeps up."""
    return _env_int("REFCNTD_RINGBUF_PAGES", 1024, 1 << 18, power_of_two=True)


def _env_int(name: str, default: int, high: int, power_of_two: bool = False) -> int:
    """A kernel table's size from the environment (REFCNTD_RINGBUF_PAGES,
    REFCNTD_MAX_ALLOC_SITES): smaller only to test what happens when it is full."""
    raw = os.environ.get(name, str(default))
    value = int(raw) if raw.isdigit() else 0
    if not 1 <= value <= high or (power_of_two and value & (value - 1)):
        shape = "a power of 2" if power_of_two else "an integer"
        raise UsageError(f"{name}={raw}: {shape} from 1 to {high}")
    return value
