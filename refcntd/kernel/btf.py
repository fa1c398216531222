"""Minimal reader of the kernel's BTF: one struct member's offset.

bcc compiles against Debian's generic 6.1 headers, whose struct layouts need
not match the running kernel; a field of task_struct is only read at an
offset taken from the running kernel's own /sys/kernel/btf/vmlinux.
"""

from __future__ import annotations

import hashlib
import platform
import struct
from pathlib import Path

from refcntd.paths import CACHE_DIR, read_cache_json, write_cache_json

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F
KIND_STRUCT = 4
KIND_UNION = 5
# bytes of kind-specific data after each 12-byte btf_type: (fixed, per vlen entry)
_TRAILER = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0),
            15: (0, 12), 17: (4, 0), 19: (0, 12)}


def member_offset(struct_name: str, member: str, path: Path = VMLINUX_BTF) -> int | None:
    """Byte offset of `member` in `struct struct_name`, or None if not found/readable.

    Members inside anonymous structs and unions (vm_area_struct.vm_start,
    mm_struct.start_code) are found too.  Answers are kept per kernel (the BTF
    file's identity) in the cache directory: parsing the kernel's BTF takes
    0.1 s of every attach's start.
    """
    cache = _offset_cache(path)
    key = f"{struct_name}.{member}"
    if key not in cache:
        cache[key] = _member_offset(struct_name, member, path)
        write_cache_json(_cache_file(path), cache)
    return cache[key]


_OFFSETS: dict[Path, dict[str, int | None]] = {}


def _cache_file(path: Path) -> Path:
    try:
        st = path.stat()
        ident = f"{platform.release()}-{st.st_size}-{st.st_mtime_ns}"
    except OSError:
        ident = "unreadable"
    digest = hashlib.sha1(f"{path}|{ident}".encode()).hexdigest()[:16]
    return CACHE_DIR / f"btf-offsets-{digest}.json"


def _offset_cache(path: Path) -> dict[str, int | None]:
    if path not in _OFFSETS:
        try:
            loaded = read_cache_json(_cache_file(path))  # None: AttributeError below
            _OFFSETS[path] = {str(k): v if isinstance(v, int) else None
                              for k, v in loaded.items()}
        except (OSError, ValueError, AttributeError):
            _OFFSETS[path] = {}
    return _OFFSETS[path]


def _member_offset(struct_name: str, member: str, path: Path) -> int | None:
    types = _types(path)
    for kind, name, members in types.values():
        if kind == KIND_STRUCT and name == struct_name:
            return _find_member(types, members, member)
    return None


_Type = tuple[int, str, list[tuple[str, int, int]]]  # kind, name, members (name, type, bits)
_CACHE: dict[Path, dict[int, _Type]] = {}


def _types(path: Path) -> dict[int, _Type]:
    """Every struct and union of the BTF file, by type id (read once per path)."""
    if path in _CACHE:
        return _CACHE[path]
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    if len(data) < 24:
        return {}
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from(
        "<HBBIIIII", data, 0)
    if magic != BTF_MAGIC:
        return {}
    strings = hdr_len + str_off
    out: dict[int, _Type] = {}
    pos, end, type_id = hdr_len + type_off, hdr_len + type_off + type_len, 1
    while pos + 12 <= end:
        name_off, info, _size = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, per = _TRAILER.get(kind, (0, 0))
        if kind in (KIND_STRUCT, KIND_UNION):
            members = []
            for i in range(vlen):
                m_name, m_type, offset = struct.unpack_from("<III", data, pos + 12 + 12 * i)
                bits = offset & 0xFFFFFF if info >> 31 else offset
                members.append((_name(data, strings + m_name), m_type, bits))
            out[type_id] = (kind, _name(data, strings + name_off), members)
        pos += 12 + fixed + per * vlen
        type_id += 1
    _CACHE[path] = out
    return out


def _find_member(types: dict[int, _Type], members: list[tuple[str, int, int]],
                 member: str) -> int | None:
    for name, _type, bits in members:
        if name == member:
            return bits // 8
    for name, type_id, bits in members:
        if not name and type_id in types:  # an anonymous struct or union
            inner = _find_member(types, types[type_id][2], member)
            if inner is not None:
                return bits // 8 + inner
    return None


def _name(data: bytes, at: int) -> str:
    end = data.index(b"\0", at)
    return data[at:end].decode(errors="replace")


UNWIND_MEMBERS = {"OFF_TASK_MM": ("task_struct", "mm"), "OFF_TASK_FILES": ("task_struct", "files"),
                  "OFF_MM_START_CODE": ("mm_struct", "start_code"),
                  "OFF_MM_END_CODE": ("mm_struct", "end_code"),
                  "OFF_MM_EXE_FILE": ("mm_struct", "exe_file"),
                  "OFF_FILES_FDT": ("files_struct", "fdt"), "OFF_FDT_FD": ("fdtable", "fd"),
                  "OFF_FILE_INODE": ("file", "f_inode"), "OFF_INODE_INO": ("inode", "i_ino"),
                  "OFF_INODE_SB": ("inode", "i_sb"), "OFF_SB_DEV": ("super_block", "s_dev")}


# A pending uretprobe replaced its function's return address on the stack with the
# uprobe trampoline; the original is in the thread's return_instance list (optional:
# without them unwind.h leaves such a frame, and the stack ends there)
URETPROBE_MEMBERS = {"OFF_TASK_UTASK": ("task_struct", "utask"),
                     "OFF_UTASK_RI": ("uprobe_task", "return_instances"),
                     "OFF_RI_STACK": ("return_instance", "stack"),
                     "OFF_RI_ORIG_RET": ("return_instance", "orig_ret_vaddr"),
                     "OFF_RI_NEXT": ("return_instance", "next"),
                     "OFF_MM_UPROBES": ("mm_struct", "uprobes_state"),
                     "OFF_UPROBES_XOL": ("uprobes_state", "xol_area"),
                     "OFF_XOL_VADDR": ("xol_area", "vaddr")}


def unwind_offsets(path: Path = VMLINUX_BTF) -> dict[str, int] | None:
    """The kernel struct offsets bpf/unwind.h reads mappings with; None if any is unknown.
    The URETPROBE_MEMBERS are added when all of them are known."""
    out = _offsets(UNWIND_MEMBERS, path)
    if out is not None:
        out.update(_offsets(URETPROBE_MEMBERS, path) or {})
    return out


def _offsets(members: dict[str, tuple[str, str]], path: Path) -> dict[str, int] | None:
    out = {}
    for name, (struct_name, member) in members.items():
        offset = member_offset(struct_name, member, path)
        if offset is None:
            return None
        out[name] = offset
    return out
