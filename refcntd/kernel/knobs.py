"""The BPF program's run-time configuration (bpf/knobs.h): one `config` entry per start.

Every option that only picks a branch in bpf/ is a field of `struct refcntd_config`,
written here into the program's one-entry `config` array before any program is
loaded, then frozen.  The map is read-only to the programs (BPF_F_RDONLY_PROG), so
once frozen the verifier reads its fields as constants and follows only the branches
this start takes: one compiled object serves every option set, verified as cheaply
as the -D variant compiled for it was.

Why not libbpf's way (`const volatile` globals in .rodata, set before the load):
bcc 0.26 creates no map for .rodata and leaves the global's ld_imm64 unrelocated
(src 0, imm 0: address 0), which the verifier refuses ("invalid mem access
'scalar'"); the compiled-program cache could not carry it either (progcache.capture
knows only map references).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from refcntd.kernel import abi, bpfsys

if TYPE_CHECKING:
    from refcntd.kernel.program import KernelOptions

MAP = "config"
MAP_FREEZE = 22  # BPF_MAP_FREEZE: no more writes from user space


class _Freeze(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32)]


def config(opts: KernelOptions, live: tuple[int, int] | None = None) -> abi.RefcntdConfig:
    """The configuration `opts` ask for (holding needs the unwinder's mapping hooks);
    `live`: the offsets of task_struct.signal and signal_struct.live, read at a process
    exit where sched_process_exit has no group_dead (program.kernel_choices)."""
    unwind = opts.unwind_offsets is not None
    cfg = abi.RefcntdConfig(
        filtered=opts.filtered, has_delete=opts.has_delete, absorbs_put=opts.absorbs_put,
        filter_comm=bool(opts.comm_filter), filter_exe=opts.exe_filter and unwind,
        unwind=unwind, hold=opts.hold and unwind,
        hold_tables=opts.hold and opts.hold_tables and unwind,
        hold_execs=opts.hold and opts.hold_execs and unwind,
        sites=opts.sites, history=opts.history is not None,
        history_all=opts.history == ("all",), history_depth=opts.history_depth,
        exit_code_off=-1 if opts.exit_code_offset is None else opts.exit_code_offset,
        cgroup_id=opts.cgroup_id or 0,  # a cgroup v2 id is an inode number: never 0
        off_task_signal=live[0] if live else -1, off_signal_live=live[1] if live else -1)
    fields = {name for name, *_ in abi.RefcntdConfig._fields_}
    for name, value in (opts.unwind_offsets or {}).items():  # OFF_TASK_MM -> off_task_mm
        if name.lower() not in fields:
            raise ValueError(f"unwind offset {name}: no such field in struct refcntd_config")
        setattr(cfg, name.lower(), value)
    return cfg


def write(table: bpfsys.Table, opts: KernelOptions, live: tuple[int, int] | None = None
          ) -> None:
    """Write the configuration and freeze the map, before any program is loaded: the
    verifier reads an unfrozen map's values as unknown, and would then refuse the
    history entries' bounds (knob history_depth)."""
    table[ctypes.c_int(0)] = config(opts, live)
    bpfsys.call(MAP_FREEZE, _Freeze(map_fd=table.map_fd))
