"""The compiled program's maps as this start needs them: resized from the recorded
layout (map sizes are flags, not code), history values cut to the depth asked for,
and each map's key and value as ctypes (abi.py), checked against what was recorded."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from refcntd.kernel import abi, bpfsys, progcache

if TYPE_CHECKING:
    from refcntd.kernel.program import KernelOptions


def resized(layout: progcache.Layout, sizes: dict[str, str]) -> progcache.Layout | None:
    """`layout` with its maps sized by `sizes` (the sizing flags now), where each changed
    macro is exactly some maps' declared size (abi.MAPS); None where it is not (a maps-only
    compile records the layout then)."""
    changed = {name for name in {*sizes, *layout.sizes}
               if sizes.get(name) != layout.sizes.get(name)}
    if not changed:
        return layout
    declared = [size for _, _, size in abi.MAPS.values()]
    for name in changed:
        value = sizes.get(name, "")
        if not value.isdigit() or any(name in re.findall(r"\w+", size) and size != name
                                      for size in declared):
            return None
    maps = []
    for spec in layout.maps:
        size = abi.MAPS.get(spec.name, ("", "", ""))[2]
        if size in changed:
            entries = int(sizes[size]) * (os.sysconf("SC_PAGE_SIZE")
                                          if spec.map_type == bpfsys.MAP_RINGBUF else 1)
            spec = replace(spec, max_entries=entries)
        maps.append(spec)
    return progcache.Layout(layout.key, tuple(maps), sizes, layout.btf)


def history_sized(layout: progcache.Layout, depth: int) -> progcache.Layout:
    """`layout` with the values of the maps of struct hist_val cut to `depth` entries
    (knob history_depth): compiled with abi.HISTORY_DEPTH of them, the programs never
    touch an entry beyond the depth (the verifier checks it).  Without BTF: its type
    has the compiled size, and the kernel refuses a map whose value size differs."""
    size = ctypes.sizeof(abi.hist_val_type(depth))
    maps = tuple(replace(spec, value_size=size, btf_key=0, btf_value=0)
                 if abi.MAPS.get(spec.name, ("", "", ""))[1] == "hist_val"
                 and spec.value_size != size else spec for spec in layout.maps)
    return replace(layout, maps=maps)


def map_types(name: str, spec: progcache.MapSpec, opts: KernelOptions) -> tuple[Any, Any]:
    """A map's key and value as ctypes, from abi.MAPS (the declarations in bpf/);
    bytes of the recorded sizes for the maps only the BPF side reads."""
    key, value, _ = abi.MAPS.get(name, ("", "", ""))
    return (_ctype(key, opts) or ctypes.c_uint8 * spec.key_size,
            _ctype(value, opts) or ctypes.c_uint8 * spec.value_size)


_SCALARS = {"int": ctypes.c_int32, "__u32": ctypes.c_uint32, "__u64": ctypes.c_uint64,
            "__s64": ctypes.c_int64}


def _ctype(name: str, opts: KernelOptions) -> Any:
    if name == "hist_val":
        return abi.hist_val_type(opts.history_depth)
    return _SCALARS.get(name) or abi.STRUCTS.get(name)


def fits(layout: progcache.Layout, opts: KernelOptions, needed: Iterable[str]) -> bool:
    """The layout has every map the programs refer to (`needed`), and each map Python
    reads has the sizes abi.py says: a layout recorded otherwise (or a header changed
    without abigen) is never used."""
    for spec in layout.maps:
        if spec.map_type == bpfsys.MAP_RINGBUF:
            continue
        key, value = map_types(spec.name, spec, opts)
        if (ctypes.sizeof(key), ctypes.sizeof(value)) != (spec.key_size, spec.value_size):
            return False
    return set(needed) <= {spec.name for spec in layout.maps}
