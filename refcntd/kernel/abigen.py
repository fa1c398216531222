"""Generate refcntd/kernel/abi.py from bpf/refcntd.h, the one source of the kernel ABI.

The header is the contract between the BPF program and Python.  This module
reads the small subset of C the header is written in (#define constants,
enums with one comment per member, structs of fixed-width integers, chars,
arrays and nested structs) and writes ctypes mirrors, IntEnums and
explanation tables.  `python -m refcntd.kernel.abigen` rewrites abi.py; a
unit test fails when the committed abi.py differs from what the header
generates, and program.py compares every map's key and value, field by
field, with what bcc compiled (see bcccompile._check_layout).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from refcntd.paths import BPF_DIR

HEADER = BPF_DIR / "refcntd.h"
OUTPUT = Path(__file__).resolve().parent / "abi.py"

CTYPES = {"__u8": "C.c_uint8", "__s8": "C.c_int8", "__u16": "C.c_uint16", "__s16": "C.c_int16",
          "__u32": "C.c_uint32", "__s32": "C.c_int32", "__u64": "C.c_uint64",
          "__s64": "C.c_int64", "char": "C.c_char", "int": "C.c_int32"}
# Kernel types used by the header, written as the kernel's uapi declares them.
EXTERNAL = {"bpf_stack_build_id": [("status", "C.c_int32", []), ("build_id", "C.c_ubyte", ["20"]),
                                   ("offset_or_ip", "C.c_uint64", [])]}
ENUM_CLASSES = {"refcntd_role": "Role", "refcntd_stat": "Stat", "refcntd_event": "EventKind",
                "refcntd_anomaly": "AnomalyKind", "refcntd_loc": "LocKind",
                "refcntd_unwind": "UnwindMethod", "refcntd_trunc": "Truncation",
                "refcntd_cfa": "CfaRule"}
ENUM_PREFIX = {"refcntd_role": "ROLE_", "refcntd_stat": "ST_", "refcntd_event": "EV_",
               "refcntd_anomaly": "AN_", "refcntd_loc": "LOC_",
               "refcntd_unwind": "UW_", "refcntd_trunc": "TR_", "refcntd_cfa": "CFA_"}


@dataclass
class Member:
    name: str
    value: int
    comment: str


@dataclass
class Field:
    name: str
    ctype: str  # a ctypes expression or a struct name
    dims: list[str]


@dataclass
class Header:
    defines: dict[str, str]
    tunable: set[str]  # #ifndef X / #define X default: set by -D at compile time
    enums: dict[str, list[Member]]
    structs: dict[str, list[Field]]


_COMMENT = re.compile(r"/\*(.*?)\*/", re.S)


def parse(text: str) -> Header:
    """Parse the header's declarations; anything else in it is ignored."""
    defines: dict[str, str] = {}
    tunable: set[str] = set()
    for m in re.finditer(r"^#ifndef (\w+)\n#define \1 (\S+)", text, re.M):
        tunable.add(m[1])
    for m in re.finditer(r"^#define (\w+) ([^\s/]+)", text, re.M):
        defines[m[1]] = m[2].rstrip("uUlL") if m[2][0].isdigit() else m[2]
    enums = {m[1]: _members(m[2]) for m in re.finditer(r"enum (\w+) \{(.*?)\};", text, re.S)}
    structs = {m[1]: _fields(m[2]) for m in re.finditer(r"struct (\w+) \{(.*?)\};", text, re.S)}
    return Header(defines, tunable, enums, structs)


def _members(body: str) -> list[Member]:
    out: list[Member] = []
    value = -1
    # One member per line (or several on one line), each optionally followed by a comment.
    for m in re.finditer(r"(\w+)(?:\s*=\s*(\d+))?\s*,?\s*(?:/\*(.*?)\*/)?", body, re.S):
        if not m[1] or m[1].isdigit():
            continue
        value = int(m[2]) if m[2] is not None else value + 1
        out.append(Member(m[1], value, " ".join((m[3] or "").split())))
    return out


def _fields(body: str) -> list[Field]:
    out = []
    for decl in _COMMENT.sub("", body).split(";"):
        m = re.fullmatch(r"\s*(struct\s+\w+|\w+)\s+(\w+)((?:\[\w+\])*)\s*", decl)
        if m:
            ctype = m[1].split()[-1] if m[1].startswith("struct") else CTYPES[m[1]]
            out.append(Field(m[2], ctype, re.findall(r"\[(\w+)\]", m[3])))
    return out


def _class(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _field_type(f: Field, tunable: set[str]) -> str:
    base = f.ctype if f.ctype.startswith("C.") else _class(f.ctype)
    for dim in reversed(f.dims):
        base = f"({base} * {dim.lower() if dim in tunable else dim})"
    return base


def _uses(fields: list[Field], tunable: set[str]) -> list[str]:
    return sorted({d for f in fields for d in f.dims if d in tunable})


def render(h: Header) -> str:
    """The text of abi.py."""
    out = ['"""The kernel ABI, generated from bpf/refcntd.h by refcntd/kernel/abigen.py.',
           "", "Do not edit: change the header and run `python -m refcntd.kernel.abigen`.",
           '"""', "", "from __future__ import annotations", "", "import ctypes as C",
           "from enum import IntEnum", ""]
    for name, value in h.defines.items():
        if value.lstrip("-").isdigit() and name not in ENUM_PREFIX.values():
            out.append(f"{name} = {value}")
    for enum, members in h.enums.items():
        cls, prefix = ENUM_CLASSES[enum], ENUM_PREFIX[enum]
        out += ["", "", f"class {cls}(IntEnum):"]
        out += [f"    {m.name.removeprefix(prefix)} = {m.value}" for m in members
                if m.name != prefix + "COUNT"]
        text = {m.name.removeprefix(prefix): m.comment for m in members
                if m.comment and m.name != prefix + "COUNT"}
        if text:
            out += ["", "", f"{cls.upper()}_TEXT: dict[{cls}, str] = {{"]
            out += [f"    {cls}.{k}: {v!r}," for k, v in text.items()]
            out.append("}")
    structs = dict(EXTERNAL_FIELDS())
    structs.update(h.structs)
    for name, fields in structs.items():
        params = _uses(fields, h.tunable)
        body = [f'        ("{f.name}", {_field_type(f, h.tunable)}),' for f in fields]
        if params:
            args = ", ".join(f"{p.lower()}: int = {h.defines[p]}" for p in params)
            out += ["", "", f"def {name}_type({args}) -> type[C.Structure]:",
                    f'    """struct {name} with {", ".join(params)} as given; the default '
                    f'is the header\'s, as compiled."""',
                    f'    return type("{_class(name)}", (C.Structure,), {{"_fields_": [',
                    *body, "    ]})"]
        else:
            out += ["", "", f"class {_class(name)}(C.Structure):", "    _fields_ = [",
                    *body, "    ]"]
    out += ["", "", "STRUCTS: dict[str, type[C.Structure]] = {"]
    out += [f'    "{n}": {_class(n)},' for n, f in structs.items() if not _uses(f, h.tunable)]
    out += ["}", ""]
    return "\n".join(out)


_MAP_DECL = re.compile(r"^(BPF_(?:PERCPU_)?(?:ARRAY|HASH)|BPF_F_TABLE|BPF_TABLE|BPF_PROG_ARRAY"
                       r"|BPF_RINGBUF_OUTPUT)\((.*?)\);", re.M | re.S)


def map_declarations(texts: list[str]) -> dict[str, tuple[str, str, str]]:
    """Every map the BPF sources declare: name -> (key type, value type, size), each
    type a struct name of the header or a scalar C type ("" for the ring buffer's
    none), the size as written (a number or a macro).  The loader reads and writes
    maps created without bcc through these types, and sizes them from the flags."""
    out: dict[str, tuple[str, str, str]] = {}
    for text in texts:
        for m in _MAP_DECL.finditer(_COMMENT.sub("", text)):
            args = [" ".join(a.split()).removeprefix("struct ") for a in m[2].split(",")]
            macro = m[1]
            if macro in ("BPF_ARRAY", "BPF_PERCPU_ARRAY"):
                out[args[0]] = ("int", args[1], args[2])
            elif macro in ("BPF_HASH", "BPF_PERCPU_HASH"):
                out[args[0]] = (args[1], args[2], args[3])
            elif macro in ("BPF_TABLE", "BPF_F_TABLE"):
                out[args[3]] = (args[1], args[2], args[4])
            elif macro == "BPF_PROG_ARRAY":
                out[args[0]] = ("int", "int", args[1])
            else:
                out[args[0]] = ("", "", args[1])
    return out


def render_maps(maps: dict[str, tuple[str, str, str]]) -> str:
    lines = ["", "# name -> (key type, value type, size as declared) of every map in bpf/",
             "MAPS: dict[str, tuple[str, str, str]] = {"]
    lines += [f'    "{name}": ("{k}", "{v}", "{n}"),' for name, (k, v, n) in sorted(maps.items())]
    return "\n".join([*lines, "}", ""])


def EXTERNAL_FIELDS() -> dict[str, list[Field]]:  # noqa: N802 - a table, named like one
    return {n: [Field(a, t, d) for a, t, d in fs] for n, fs in EXTERNAL.items()}


def generate(header: Path = HEADER) -> str:
    sources = sorted([*header.parent.glob("*.c"), *header.parent.glob("*.h")])
    return render(parse(header.read_text())) + render_maps(
        map_declarations([p.read_text() for p in sources]))


def main() -> int:
    text = generate()
    if "--check" in sys.argv:
        return 0 if OUTPUT.read_text() == text else 1
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
