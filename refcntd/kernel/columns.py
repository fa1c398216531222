"""The objects of one process as columns, decoded from batch reads of the object map.

A million ObjectRecords cost seconds to build and most of a gigabyte; these
columns (one typed array per field of struct obj_val, plus the address) are
filled by C loops over the batch buffers and cost 8 bytes a field.  The
report groups them by (type, allocation stack) without a record per object.
It still reads as a sequence of ObjectRecord for the code that wants records.
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from refcntd.kernel.records import ObjectRecord, StackRef

if TYPE_CHECKING:  # numpy is imported when live objects are counted, not by every command
    import numpy as np
    import numpy.typing as npt

SITE_KEY = ("tgid", "name", "name_ptr", "stack_id", "caller_ip")  # "name": the type's


@dataclass(frozen=True)
class ObjectColumns:
    tgid: int
    columns: dict[str, array[int]]  # "addr" and every field of struct obj_val
    type_names: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["addr"])

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, i: int) -> ObjectRecord:
        c = self.columns
        type_id = c["type_id"][i]
        return ObjectRecord(self.tgid, c["gen"][i], c["addr"][i], c["count"][i],
                            self.type_names.get(type_id, "") if type_id else "",
                            c["init_ns"][i], c["stack_id"][i], c["caller_ip"][i],
                            c["name_ptr"][i], c["gets"][i], c["puts"][i])

    def __iter__(self) -> Iterator[ObjectRecord]:
        return (self[i] for i in range(len(self)))

    def stack_refs(self) -> list[StackRef]:
        """The distinct allocation stacks of these objects."""
        c = self.columns
        return [StackRef(*k) for k in set(zip(c["stack_id"], c["caller_ip"], strict=True))]


@dataclass(frozen=True)
class LiveSite:
    """The live objects of one (process, type name, allocation stack): every one
    counted, the first `shown` in map order kept as records."""

    tgid: int
    type_name: str
    name_ptr: int
    stack_id: int
    caller_ip: int
    objects: int
    references: int  # the sum of their counts
    age_ns: int  # the sum of their ages
    shown: tuple[ObjectRecord, ...]


def live_sites(columns: dict[str, array[int]], names: dict[int, str], now_ns: int,
               shown: int) -> list[LiveSite]:
    """Objects read as columns ("tgid", "addr" and struct obj_val's fields), counted
    per site by numpy: a million objects without a record each (one record each took
    7.9 s and 420 MiB).  Sites are keyed by type name, not id, as records would be."""
    import numpy as np
    col = {k: np.frombuffer(v, dtype=np.dtype(v.typecode)) for k, v in columns.items()}
    n = len(col["addr"])
    if not n:
        return []
    ids, id_rows = np.unique(col["type_id"], return_inverse=True)
    labels = [names.get(t, "") if t else "" for t in ids.tolist()]
    index: dict[str, int] = {}
    col["name"] = np.array([index.setdefault(x, len(index)) for x in labels])[id_rows]
    # the row number last: equal keys keep map order, so "first shown" means what it did
    order = np.lexsort([np.arange(n), *(col[k] for k in reversed(SITE_KEY))])
    starts = _starts([col[k][order] for k in SITE_KEY])
    inits = col["init_ns"][order]
    ages = np.where(inits > now_ns, 0, np.uint64(now_ns) - inits)
    objects = np.diff(np.append(starts, n)).tolist()
    references = _exact_sums(col["count"][order], starts)
    age_sums = _exact_sums(ages.astype(np.int64), starts)
    first = order[starts].tolist()
    out = []
    for g, start in enumerate(starts.tolist()):
        rows = order[start:start + min(shown, objects[g])]
        row = first[g]
        out.append(LiveSite(int(col["tgid"][row]), labels[id_rows[row]],
                            int(col["name_ptr"][row]), int(col["stack_id"][row]),
                            int(col["caller_ip"][row]), objects[g], references[g],
                            age_sums[g], _records(col, rows, names)))
    return out


def _starts(keys: list[npt.NDArray[Any]]) -> npt.NDArray[np.intp]:
    """Where each run of equal keys begins in sorted rows."""
    import numpy as np
    change = np.zeros(len(keys[0]), dtype=bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def _exact_sums(values: npt.NDArray[np.int64], starts: npt.NDArray[np.intp]) -> list[int]:
    """Per run, the sum as a Python int: the high and low 32 bits are summed apart, so no
    int64 overflows (a million ages of three hours would)."""
    import numpy as np
    high = np.add.reduceat(values >> 32, starts).tolist()
    low = np.add.reduceat(values & 0xFFFFFFFF, starts).tolist()
    return [(h << 32) + lo for h, lo in zip(high, low, strict=True)]


def _records(col: dict[str, npt.NDArray[Any]], rows: npt.NDArray[np.intp],
             names: dict[int, str]) -> tuple[ObjectRecord, ...]:
    c = {k: v[rows].tolist() for k, v in col.items()}
    return tuple(ObjectRecord(c["tgid"][i], c["gen"][i], c["addr"][i], c["count"][i],
                              names.get(c["type_id"][i], "") if c["type_id"][i] else "",
                              c["init_ns"][i], c["stack_id"][i], c["caller_ip"][i],
                              c["name_ptr"][i], c["gets"][i], c["puts"][i])
                 for i in range(len(rows)))


class ColumnBuilder:
    """Appends the rows of batch buffers (ctypes arrays of key and value structs)."""

    def __init__(self, key_type: type[ctypes.Structure], value_type: type[ctypes.Structure],
                 key_fields: tuple[str, ...] = ("addr",)) -> None:
        self.key_type, self.value_type, self.key_fields = key_type, value_type, key_fields
        kinds = dict(_fields(key_type))
        self.columns: dict[str, array[int]] = {k: array(kinds[k]._type_) for k in key_fields}
        for name, ctype in _fields(value_type):
            self.columns[name] = array(ctype._type_)

    def add(self, keys: ctypes.Array[ctypes.Structure], values: ctypes.Array[ctypes.Structure],
            n: int, keep: list[int] | None) -> None:
        """Rows 0..n-1, or only the rows in `keep`."""
        for name in self.key_fields:
            self._add(name, column(keys, self.key_type, name, n), keep)
        for name, _ in _fields(self.value_type):
            self._add(name, column(values, self.value_type, name, n), keep)

    def _add(self, name: str, column: memoryview, keep: list[int] | None) -> None:
        if keep is None:  # strided copy in C, no Python int per value
            self.columns[name].frombytes(column.tobytes())
        else:
            self.columns[name].extend([column[i] for i in keep])


def column(buf: ctypes.Array[ctypes.Structure], struct: type[ctypes.Structure], name: str,
            n: int) -> memoryview:
    """Field `name` of rows 0..n-1 of `buf`, as a strided view (no Python loop)."""
    f = getattr(struct, name)
    fmt: Any = dict(_fields(struct))[name]._type_
    stride = ctypes.sizeof(struct)
    if stride % f.size or f.offset % f.size:
        raise ValueError(f"{struct.__name__}.{name} is not aligned to its size")
    words: memoryview = memoryview(buf).cast("B")[:n * stride].cast(fmt)
    return words[f.offset // f.size::stride // f.size]


def _fields(struct: type[ctypes.Structure]) -> list[tuple[str, Any]]:
    """(name, ctypes type) of a struct's fields (the ABI structs have no bit fields)."""
    return [(f[0], f[1]) for f in struct._fields_]
