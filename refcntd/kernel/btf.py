"""Minimal reader of the kernel's BTF: one struct member's offset.

bcc compiles against Debian's generic 6.1 headers, whose struct layouts need
not match the running kernel; a field of task_struct is only read at an
offset taken from the running kernel's own /sys/kernel/btf/vmlinux.
"""

from __future__ import annotations

import struct
from pathlib import Path

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F
KIND_STRUCT = 4
# bytes of kind-specific data after each 12-byte btf_type: (fixed, per vlen entry)
_TRAILER = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0),
            15: (0, 12), 17: (4, 0), 19: (0, 12)}


def member_offset(struct_name: str, member: str, path: Path = VMLINUX_BTF) -> int | None:
    """Byte offset of `member` in `struct struct_name`, or None if not found/readable."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 24:
        return None
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from(
        "<HBBIIIII", data, 0)
    if magic != BTF_MAGIC:
        return None
    strings = hdr_len + str_off
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    while pos + 12 <= end:
        name_off, info, _size = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, per = _TRAILER.get(kind, (0, 0))
        if kind == KIND_STRUCT and _name(data, strings + name_off) == struct_name:
            return _find_member(data, pos + 12, vlen, strings, member, bool(info >> 31))
        pos += 12 + fixed + per * vlen
    return None


def _find_member(data: bytes, pos: int, vlen: int, strings: int, member: str,
                 bitfield_encoding: bool) -> int | None:
    for i in range(vlen):
        name_off, _type, offset = struct.unpack_from("<III", data, pos + 12 * i)
        if _name(data, strings + name_off) == member:
            bits: int = offset & 0xFFFFFF if bitfield_encoding else offset
            return bits // 8
    return None


def _name(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode(errors="replace")
