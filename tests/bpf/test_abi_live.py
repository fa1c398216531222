"""The compiled program's maps are compared field by field with abi.py when compiled
(a start from the cache checks every map's sizes against abi.py; the cache key
covers every file in bpf/, so a changed header is compiled and checked again)."""

from __future__ import annotations

import os


def test_every_map_struct_is_checked_against_the_compiled_program(bpf):
    from refcntd.kernel.kheaders import find_kernel_source
    from refcntd.kernel.program import KernelOptions, compile_program

    os.environ.setdefault("BCC_KERNEL_SOURCE", str(find_kernel_source()))
    from refcntd.kernel.btf import unwind_offsets
    program = compile_program(KernelOptions(filtered=True, has_delete=True, history=("all",),
                                            history_depth=32, unwind_offsets=unwind_offsets()),
                              16, cached=False)
    checked = program.layout_checked
    program.cleanup()
    # The records that carry every field user space decodes: objects, events,
    # anomalies, history (at a non-default depth), stacks, processes, types,
    # and what the CFI unwinder reads (tables, modules, mappings).
    assert {"obj_key", "obj_val", "event", "anomaly", "hist_val", "stack_rec", "proc_val",
            "type_name", "type_totals", "grave_val", "site_key", "probe_cfg", "proc_stack",
            "cfi_row", "cfi_module", "file_key", "exec_maps", "mmap_args"} <= checked
