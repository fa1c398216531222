"""Google's pprof schema, `perftools.profiles.Profile`, declared in code.

The messages and field numbers are those of google/pprof's proto/profile.proto
(commit b9395ee of 2026-07, every field it has).  They are declared here through
`descriptor_pb2` and turned into message classes by the protobuf runtime
(`message_factory.GetMessageClass`), so the wire format is the protobuf
library's own, with no protoc step and no generated code in the tree.  The
schema lives in a pool of its own: a program that also loads a generated
profile_pb2 does not collide with it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "perftools.profiles"
_F = descriptor_pb2.FieldDescriptorProto
_REPEATED, _OPTIONAL = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
_KINDS = {"int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64, "bool": _F.TYPE_BOOL,
          "string": _F.TYPE_STRING}

# message -> (field name, number, type, repeated); a type not in _KINDS is a message
SCHEMA: dict[str, list[tuple[str, int, str, bool]]] = {
    "Profile": [("sample_type", 1, "ValueType", True), ("sample", 2, "Sample", True),
                ("mapping", 3, "Mapping", True), ("location", 4, "Location", True),
                ("function", 5, "Function", True), ("string_table", 6, "string", True),
                ("drop_frames", 7, "int64", False), ("keep_frames", 8, "int64", False),
                ("time_nanos", 9, "int64", False), ("duration_nanos", 10, "int64", False),
                ("period_type", 11, "ValueType", False), ("period", 12, "int64", False),
                ("comment", 13, "int64", True), ("default_sample_type", 14, "int64", False),
                ("doc_url", 15, "int64", False)],
    "ValueType": [("type", 1, "int64", False), ("unit", 2, "int64", False)],
    "Sample": [("location_id", 1, "uint64", True), ("value", 2, "int64", True),
               ("label", 3, "Label", True)],
    "Label": [("key", 1, "int64", False), ("str", 2, "int64", False),
              ("num", 3, "int64", False), ("num_unit", 4, "int64", False)],
    "Mapping": [("id", 1, "uint64", False), ("memory_start", 2, "uint64", False),
                ("memory_limit", 3, "uint64", False), ("file_offset", 4, "uint64", False),
                ("filename", 5, "int64", False), ("build_id", 6, "int64", False),
                ("has_functions", 7, "bool", False), ("has_filenames", 8, "bool", False),
                ("has_line_numbers", 9, "bool", False),
                ("has_inline_frames", 10, "bool", False)],
    "Location": [("id", 1, "uint64", False), ("mapping_id", 2, "uint64", False),
                 ("address", 3, "uint64", False), ("line", 4, "Line", True),
                 ("is_folded", 5, "bool", False)],
    "Line": [("function_id", 1, "uint64", False), ("line", 2, "int64", False),
             ("column", 3, "int64", False)],
    "Function": [("id", 1, "uint64", False), ("name", 2, "int64", False),
                 ("system_name", 3, "int64", False), ("filename", 4, "int64", False),
                 ("start_line", 5, "int64", False)],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="refcntd/profile.proto", package=PACKAGE,
                                               syntax="proto3")
    for name, fields in SCHEMA.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            entry = message.field.add(name=field, number=number,
                                      label=_REPEATED if repeated else _OPTIONAL)
            if kind in _KINDS:
                entry.type = _KINDS[kind]
            else:
                entry.type, entry.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    return proto


@cache
def message(name: str) -> Any:
    """The class of message `name` ("Profile", "Sample", ...): protobuf builds its
    attributes at run time, so its instances are Any to the type checker."""
    pool = _pool()
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


@cache
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return pool
