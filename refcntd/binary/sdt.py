"""SDT (USDT) probes from `.note.stapsdt`: locations, semaphores, argument specs.

An argument spec such as `-4@%edi`, `8@-16(%rbp)` or `8@$5` says the
argument's size (negative: signed) and where it is at the probe site; the
BPF side fetches it from a descriptor built here, never assuming registers.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import cast

from elftools.elf.sections import NoteSection

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError

LOC_REG, LOC_MEM, LOC_IMM = 1, 2, 3

# Offsets of the saved registers in x86-64 struct pt_regs (arch/x86/include/asm/ptrace.h).
PT_REGS_OFFSET = {"r15": 0, "r14": 8, "r13": 16, "r12": 24, "rbp": 32, "rbx": 40, "r11": 48,
                  "r10": 56, "r9": 64, "r8": 72, "rax": 80, "rcx": 88, "rdx": 96, "rsi": 104,
                  "rdi": 112, "rip": 128, "rsp": 152}
_SUBREGS = {"rax": ("eax", "ax", "al"), "rbx": ("ebx", "bx", "bl"), "rcx": ("ecx", "cx", "cl"),
            "rdx": ("edx", "dx", "dl"), "rsi": ("esi", "si", "sil"), "rdi": ("edi", "di", "dil"),
            "rbp": ("ebp", "bp", "bpl"), "rsp": ("esp", "sp", "spl")}
_ARG_RE = re.compile(r"^(?P<size>-?\d+)@(?P<loc>.+)$")
_MEM_RE = re.compile(r"^(?P<disp>-?(?:0x[0-9a-fA-F]+|\d+))?\(%(?P<reg>\w+)\)$")


@dataclass(frozen=True)
class ArgLoc:
    """Where one value is at a probe: a register, memory at reg+disp, or a constant."""

    kind: int
    size: int  # 1, 2, 4 or 8 bytes
    signed: bool
    reg: str = ""
    value: int = 0  # displacement (LOC_MEM) or the constant (LOC_IMM)

    @property
    def reg_offset(self) -> int:
        return PT_REGS_OFFSET.get(self.reg, 0)

    def describe(self) -> str:
        sign = "signed " if self.signed else ""
        if self.kind == LOC_IMM:
            return f"constant {self.value}"
        if self.kind == LOC_MEM:
            return f"{sign}{self.size}-byte memory at {self.value}(%{self.reg})"
        return f"{sign}{self.size}-byte %{self.reg}"


def register_arg(index: int) -> ArgLoc:
    """The SysV x86-64 location of integer argument `index` (1-based) at function entry."""
    return ArgLoc(LOC_REG, 8, False, ("rdi", "rsi", "rdx", "rcx", "r8", "r9")[index - 1])


RETURN_VALUE = ArgLoc(LOC_REG, 8, False, "rax")


@dataclass(frozen=True)
class SdtProbe:
    provider: str
    name: str
    pc: int  # virtual address of the probe's nop
    semaphore: int  # virtual address, 0 when the probe has none
    args: tuple[ArgLoc, ...]
    arg_text: str

    @property
    def full_name(self) -> str:
        return f"{self.provider}:{self.name}"


def _canonical_reg(name: str) -> str:
    if name in PT_REGS_OFFSET:
        return name
    for full, subs in _SUBREGS.items():
        if name in subs:
            return full
    m = re.fullmatch(r"(r(?:8|9|1[0-5]))[dwb]", name)
    if m and m.group(1) in PT_REGS_OFFSET:
        return m.group(1)
    raise ValueError(f"unknown register %{name}")


def parse_arg(text: str) -> ArgLoc:
    """One SDT argument spec; ValueError for forms refcntd cannot fetch."""
    m = _ARG_RE.match(text)
    if not m:
        raise ValueError(f"malformed SDT argument '{text}'")
    size, loc = int(m.group("size")), m.group("loc")
    if abs(size) not in (1, 2, 4, 8):
        raise ValueError(f"unsupported argument size {size} in '{text}'")
    signed, size = size < 0, abs(size)
    if loc.startswith("$"):
        return ArgLoc(LOC_IMM, size, signed, value=int(loc[1:], 0))
    if loc.startswith("%"):
        return ArgLoc(LOC_REG, size, signed, _canonical_reg(loc[1:]))
    mem = _MEM_RE.match(loc)
    if mem and mem.group("reg") != "rip":
        return ArgLoc(LOC_MEM, size, signed, _canonical_reg(mem.group("reg")),
                      int(mem.group("disp") or "0", 0))
    raise ValueError(f"unsupported SDT argument location '{loc}'")


def parse_args(text: str) -> tuple[ArgLoc, ...]:
    return tuple(parse_arg(part) for part in text.split())


def sdt_probes(image: ElfImage) -> list[SdtProbe]:
    """Every probe in the image's .note.stapsdt, addresses adjusted for prelink."""
    elf = image.elffile()
    notes = elf.get_section_by_name(".note.stapsdt")
    if notes is None:
        return []
    base_section = elf.get_section_by_name(".stapsdt.base")
    actual_base = base_section["sh_addr"] if base_section is not None else 0
    out = []
    for note in cast(NoteSection, notes).iter_notes():
        if note["n_name"] != "stapsdt":  # type 3, which pyelftools mislabels
            continue
        out.append(_decode_note(note["n_descdata"], actual_base))
    return out


def _decode_note(desc: bytes | str, actual_base: int) -> SdtProbe:
    raw = desc.encode("latin-1") if isinstance(desc, str) else bytes(desc)
    pc, base, sema = struct.unpack_from("<QQQ", raw, 0)
    provider, name, args, *_ = raw[24:].split(b"\0") + [b"", b"", b""]
    shift = actual_base - base if actual_base and base else 0
    arg_text = args.decode(errors="replace")
    try:
        parsed = parse_args(arg_text)
    except ValueError:
        parsed = ()
    return SdtProbe(provider.decode(), name.decode(), pc + shift,
                    sema + shift if sema else 0, parsed, arg_text)


def semaphore_file_offset(image: ElfImage, probe: SdtProbe) -> int:
    """ref_ctr_offset wants a file offset; the note holds a virtual address."""
    if not probe.semaphore:
        return 0
    offset = image.vaddr_to_offset(probe.semaphore)
    if offset is None:
        raise BinaryError(f"{image.path}: semaphore of {probe.full_name} at "
                          f"0x{probe.semaphore:x} is not backed by the file")
    return offset
