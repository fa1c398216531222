"""Reading and writing BPF maps in bulk: one syscall per batch where the kernel allows,
one entry at a time where it does not.  Shared by the kernel façade's parts."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any

from refcntd.kernel import bpfsys
from refcntd.kernel.records import Totals

BATCH = 65536  # map entries read per syscall by a walk of a big map (the objects)


def items(table: bpfsys.Table) -> list[tuple[Any, Any]]:
    """Every entry (key, value)."""
    try:
        return list(table.items_lookup_batch())
    except OSError:  # older kernels / map types without batch ops
        return table.items()


def lookup_batches(table: bpfsys.Table
                   ) -> Iterator[tuple[ctypes.Array[Any], ctypes.Array[Any], int]]:
    """(keys, values, n) per BPF_MAP_LOOKUP_BATCH; the buffers are reused between batches."""
    return table.lookup_batches(BATCH)


def delete(table: Any, keys: list[Any] | ctypes.Array[Any]) -> None:
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
        with contextlib.suppress(KeyError):
            del table[key]


def take_all(table: bpfsys.Table) -> list[tuple[Any, Any]]:
    """Every entry, removed from the map."""
    found = items(table)
    delete(table, [k for k, _ in found])
    return found


def take(table: Any, tgid: int) -> list[tuple[Any, Any]]:
    """The entries of process `tgid` (keys with a tgid field), removed from the map."""
    picked = [(k, v) for k, v in items(table) if k.tgid == tgid]
    delete(table, [k for k, _ in picked])
    return picked


def update_array(table: Any, first: int, row_type: Any, packed: bytes) -> None:
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


def cpu_sums(per_cpu: Any) -> Totals:
    """A per-CPU struct type_totals summed over the CPUs."""
    a, b, c, d = (sum(getattr(cpu, f) for cpu in per_cpu)
                  for f in ("inits", "gets", "puts", "released"))
    return (a, b, c, d)


class BackgroundDelete:
    """A delete of many keys on its own thread (the kernel takes ~2 us a key; ctypes
    releases the GIL meanwhile); whoever reads that map again waits for it first."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self, table: Any, keys: ctypes.Array[Any]) -> None:
        self.wait()
        self._thread = threading.Thread(target=delete, args=(table, keys), daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
