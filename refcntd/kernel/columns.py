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
from typing import Any

from refcntd.kernel.records import ObjectRecord, StackRef


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


class ColumnBuilder:
    """Appends the rows of batch buffers (ctypes arrays of key and value structs)."""

    def __init__(self, key_type: type[ctypes.Structure], value_type: type[ctypes.Structure]
                 ) -> None:
        self.key_type, self.value_type = key_type, value_type
        self.columns: dict[str, array[int]] = {"addr": array("Q")}
        for name, ctype in _fields(value_type):
            self.columns[name] = array(ctype._type_)

    def add(self, keys: ctypes.Array[ctypes.Structure], values: ctypes.Array[ctypes.Structure],
            n: int, keep: list[int] | None) -> None:
        """Rows 0..n-1, or only the rows in `keep`."""
        self._add("addr", column(keys, self.key_type, "addr", n), keep)
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
