"""Where GLib keeps its type names, read from the code of two exported functions.

A GType name is `g_quark_to_string(node->qname)` where `node` is the type's TypeNode
(a derived GType is the node's address; a fundamental one indexes the static
`static_fundamental_type_nodes` array).  Debian's libglib and libgobject have no
`.symtab`, so the statics and the offsets are taken from the machine code of the
functions that use them, decoded with capstone:

- `g_type_name` (libgobject): `cmp rdi, 0x3fc` (the last fundamental GType), the
  array (`lea reg, [rip + X]` then `mov reg, [reg + rdi*8]`), the qname's offset
  (`mov edi, dword ptr [rdi + 0x28]`);
- `g_type_parent` (libgobject): `mov rax, qword ptr [rdi + 0x50]`, `supers[1]`:
  `supers[0]`, 8 bytes before, is the node's own GType (GLib's NODE_TYPE), which the
  reader checks on every node it reads;
- `g_quark_to_string` (libglib): the two statics it loads, `quark_seq_id` (4 bytes,
  the number of quarks) and `quarks` (8 bytes, the array of strings).

Each is checked against what it must look like (one value per question, statics in a
writable segment); anything else, a GLib built otherwise, gives None and the report
keeps the spec's type name.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import capstone
from capstone import x86
from elftools.common.exceptions import ELFError

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError

T = TypeVar("T")
# what a crafted ELF file or code can raise from pyelftools, struct or capstone
UNREADABLE = (BinaryError, ELFError, OSError, ValueError, IndexError, KeyError, TypeError,
              AttributeError, struct.error, capstone.CsError)
MAX_FILE = 64 << 20  # GLib's libraries are ~1 MiB: a bigger file of that name is not read
MAX_CODE = 256  # bytes of each function decoded (all three are under 128 here)
MAX_OFFSET = 0x400  # a TypeNode field lies within this many bytes of the node


@dataclass(frozen=True)
class GObjectLayout:
    """libgobject's statics (vaddrs in its file) and TypeNode offsets."""

    fundamental_max: int  # the largest fundamental GType (G_TYPE_FUNDAMENTAL_MAX << 2)
    fundamental_nodes: int  # vaddr of static_fundamental_type_nodes[]
    qname: int  # offset of TypeNode.qname (a 4-byte GQuark)
    supers: int  # offset of TypeNode.supers[] (supers[0]: the node's own GType)
    min_vaddr: int = 0  # of the file's first segment: mapped at its offset-0 mapping


@dataclass(frozen=True)
class QuarkLayout:
    """libglib's quark table: vaddrs in its file."""

    seq_id: int  # guint quark_seq_id: quarks handed out (valid ids are below it)
    quarks: int  # gchar **quarks
    min_vaddr: int = 0


@dataclass(frozen=True)
class _Insn:
    mnemonic: str
    size: int  # of the destination register or memory operand, in bytes
    rip_target: int | None  # a RIP-relative memory operand's address
    base_disp: int | None  # [reg + disp] without index, RIP excluded
    indexed: int  # the base register of a [base + index * 8] operand, 0: none
    imm: int | None  # an immediate source operand
    dst_reg: int  # the destination register, 0: none


Identity = tuple[int, int, int, int]  # (device, inode, size, mtime): one file's version
_gobject: dict[Identity, GObjectLayout | None] = {}
_quark: dict[Identity, QuarkLayout | None] = {}
KEPT = 16  # files remembered (each a few hundred bytes)


def gobject_layout(path: str) -> GObjectLayout | None:
    """The layout of the libgobject at `path` (any name of the file: a process's
    /proc/PID/map_files entry), decoded once per file version; None when its code is
    not as expected or it cannot be read."""
    return _remembered(_gobject, path, _decode_gobject)


def quark_layout(path: str) -> QuarkLayout | None:
    """The quark table of the libglib at `path`, as gobject_layout."""
    return _remembered(_quark, path, _decode_quark)


def _remembered(cache: dict[Identity, T | None], path: str,
                decode: Callable[[str], T | None]) -> T | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if st.st_size > MAX_FILE:
        return None
    if key not in cache:
        while len(cache) >= KEPT:
            cache.pop(next(iter(cache)))
        try:
            cache[key] = decode(path)
        except UNREADABLE:  # a file named like GLib that is not (a hostile process maps it)
            cache[key] = None
    return cache[key]


def _decode_gobject(path: str) -> GObjectLayout | None:
    image = _image(path)
    if image is None:
        return None
    name = _decode(image, "g_type_name")
    parent = _decode(image, "g_type_parent")
    if not name or not parent:
        return None
    limits = {i.imm for i in name if i.mnemonic == "cmp" and i.imm is not None}
    tables = {i.rip_target for i, then in zip(name, name[1:], strict=False)
              if i.mnemonic == "lea" and i.rip_target and then.indexed
              and then.indexed == i.dst_reg}
    qnames = {i.base_disp for i in name if i.mnemonic == "mov" and i.size == 4
              and i.base_disp is not None and 0 < i.base_disp < MAX_OFFSET}
    parents = {i.base_disp for i in parent if i.mnemonic == "mov" and i.size == 8
               and i.base_disp is not None and 8 <= i.base_disp < MAX_OFFSET}
    if len(limits) != 1 or len(tables) != 1 \
            or len(qnames) != 1 or len(parents) != 1:
        return None
    (limit,), (table,), (qname,), (parent_at,) = limits, tables, qnames, parents
    if not (0 < limit < 1 << 16 and _writable(image, table, 8 * (limit // 4 + 1))):
        return None
    assert limit is not None and table is not None and qname is not None
    assert parent_at is not None
    return GObjectLayout(limit, table, qname, parent_at - 8, image.min_vaddr())


def _decode_quark(path: str) -> QuarkLayout | None:
    image = _image(path)
    code = _decode(image, "g_quark_to_string") if image is not None else []
    loads = [i for i in code if i.mnemonic == "mov" and i.rip_target is not None]
    seq = {i.rip_target for i in loads if i.size == 4}
    arrays = {i.rip_target for i in loads if i.size == 8}
    if image is None or len(seq) != 1 or len(arrays) != 1 or not any(i.indexed for i in code):
        return None
    (seq_id,), (quarks,) = seq, arrays
    assert seq_id is not None and quarks is not None
    if not (_writable(image, seq_id, 4) and _writable(image, quarks, 8)):
        return None
    return QuarkLayout(seq_id, quarks, image.min_vaddr())


def _image(path: str) -> ElfImage | None:
    try:
        return ElfImage(path)
    except (BinaryError, OSError):
        return None


def _writable(image: ElfImage, vaddr: int, size: int) -> bool:
    """Inside a PT_LOAD segment that is not executable (.data, .bss)."""
    return any(not s.executable and s.vaddr <= vaddr and vaddr + size <= s.vaddr + s.memsz
               for s in image.segments)


def _decode(image: ElfImage, function: str) -> list[_Insn]:
    """The function's instructions up to its size (or MAX_CODE bytes): [] when the
    library does not export it."""
    rows = image.dynamic_symbols_named(function)
    syms = [s for s in image.symbols.get(function, []) if s.table == ".dynsym"]
    if not rows or not syms:
        return []
    sym = syms[0]
    code = image.code_at(sym.vaddr, min(sym.size or MAX_CODE, MAX_CODE))
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return [_insn(i) for i in md.disasm(code, sym.vaddr)]


def _insn(i: capstone.CsInsn) -> _Insn:
    ops = list(i.operands)
    dst_size = ops[0].size if ops else 0
    rip = disp = imm = None
    indexed = dst = 0
    if ops and ops[0].type == x86.X86_OP_REG:
        dst = ops[0].reg
    for op in ops:
        if op.type == x86.X86_OP_MEM:
            if op.mem.base == x86.X86_REG_RIP:
                rip = i.address + i.size + op.mem.disp
            elif op.mem.index == 0:
                disp = op.mem.disp
            elif op.mem.scale == 8:
                indexed = op.mem.base
        elif op.type == x86.X86_OP_IMM:
            imm = op.imm
    return _Insn(i.mnemonic, dst_size, rip, disp, indexed, imm, dst)
