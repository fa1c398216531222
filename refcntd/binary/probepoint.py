"""Choose where inside a function a uprobe can go, and what it will cost.

x86 uprobes refuse lock- and segment-prefixed instructions (and silently
never fire when attached while no process maps the file), and the kernel
single-steps every instruction it cannot emulate (~15x the cost).  So we walk
the straight-line code from the entry and take the first instruction that
(a) the kernel accepts, (b) is reached with the needed argument registers
intact, preferring (c) one the kernel emulates.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone
from capstone import x86_const as X

from refcntd.binary.callsites import fde_ranges
from refcntd.binary.elf import ElfImage

SCAN_LIMIT = 16  # instructions; stubs are short and args die quickly

ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
_ALIASES = {
    "rdi": {"rdi", "edi", "di", "dil"}, "rsi": {"rsi", "esi", "si", "sil"},
    "rdx": {"rdx", "edx", "dx", "dl", "dh"}, "rcx": {"rcx", "ecx", "cx", "cl", "ch"},
    "r8": {"r8", "r8d", "r8w", "r8b"}, "r9": {"r9", "r9d", "r9w", "r9b"},
    "rax": {"rax", "eax", "ax", "al", "ah"}, "rsp": {"rsp", "esp", "sp", "spl"},
    "rbp": {"rbp", "ebp", "bp", "bpl"},
}
_BAD_PREFIXES = {0xF0: "lock", 0x26: "es segment", 0x2E: "cs segment", 0x36: "ss segment",
                 0x3E: "ds segment", 0x64: "fs segment", 0x65: "gs segment"}
# Opcodes arch/x86/kernel/uprobes.c refuses or that cannot be stepped safely.
_BAD_ONE_BYTE = {0xCC: "int3", 0xCD: "int", 0xCE: "into", 0xCF: "iret", 0xF1: "int1",
                 0xF4: "hlt", 0xFA: "cli", 0xFB: "sti", 0xE4: "in", 0xE5: "in", 0xE6: "out",
                 0xE7: "out", 0xEC: "in", 0xED: "in", 0xEE: "out", 0xEF: "out", 0x6C: "ins",
                 0x6D: "ins", 0x6E: "outs", 0x6F: "outs", 0x9A: "far call", 0xEA: "far jmp"}
_BAD_TWO_BYTE = {0x05: "syscall", 0x07: "sysret", 0x34: "sysenter", 0x35: "sysexit",
                 0x0B: "ud2", 0x30: "wrmsr", 0x32: "rdmsr", 0xAA: "rsm", 0xFF: "ud0"}
NOP5 = bytes.fromhex("0f1f440000")
ENDBR64 = bytes.fromhex("f30f1efa")

COST_OPTIMIZED = "optimized"  # 5-byte NOP: the kernel calls a trampoline, no trap
COST_EMULATED = "emulated"  # trap, kernel emulates the instruction
COST_SINGLE_STEP = "single-step"  # trap + out-of-line step: ~15x the emulated cost


@dataclass(frozen=True)
class ProbePoint:
    offset: int  # from the function's start
    instruction: str
    cost: str
    reason: str
    caller_sp_offset: int  # -1: the kernel's stack walk already has the caller


@dataclass(frozen=True)
class Refusal:
    reason: str


@dataclass
class _State:
    sp_delta: int = 0
    frame_set: bool = False
    rbp_pushed: bool = False


def _disassembler() -> capstone.Cs:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return md


def first_instruction(code: bytes) -> capstone.CsInsn | None:
    return next(iter(_disassembler().disasm(code, 0)), None)


def refused_reason(insn: capstone.CsInsn) -> str | None:
    """Why the kernel will not (or must not) place a uprobe on this instruction."""
    for prefix in insn.prefix:
        if prefix in _BAD_PREFIXES:
            return f"{_BAD_PREFIXES[prefix]}-prefixed"
    raw = bytes(insn.bytes)
    body = raw.lstrip(b"\x66\xf2\xf3")
    if body and 0x40 <= body[0] <= 0x4F:
        body = body[1:]
    if not body:
        return "unknown encoding"
    if body[0] in _BAD_ONE_BYTE:
        return _BAD_ONE_BYTE[body[0]]
    if body[0] == 0x0F and len(body) > 1 and body[1] in _BAD_TWO_BYTE:
        return _BAD_TWO_BYTE[body[1]]
    return None


def cost_of(insn: capstone.CsInsn) -> str:
    """How this kernel handles a breakpoint on the instruction (README.md, "How it works,
    and why": probe placement)."""
    raw = bytes(insn.bytes)
    if raw == NOP5:
        return COST_OPTIMIZED
    if raw == b"\x90" or (insn.id == X.X86_INS_PUSH and insn.operands[0].type == X.X86_OP_REG):
        return COST_EMULATED
    if insn.id in (X.X86_INS_CALL, X.X86_INS_JMP) and insn.operands[0].type == X.X86_OP_IMM:
        return COST_EMULATED
    if capstone.CS_GRP_JUMP in insn.groups and insn.operands[0].type == X.X86_OP_IMM:
        return COST_EMULATED  # conditional jumps
    return COST_SINGLE_STEP


def _canon(insn: capstone.CsInsn, reg_id: int) -> str | None:
    name = insn.reg_name(reg_id)
    for canon, aliases in _ALIASES.items():
        if name in aliases:
            return canon
    return None


def _writes(insn: capstone.CsInsn) -> set[str]:
    _, written = insn.regs_access()
    return {c for r in written if (c := _canon(insn, r))}


def _ends_straight_line(insn: capstone.CsInsn) -> bool:
    groups = set(insn.groups)
    return bool(groups & {capstone.CS_GRP_JUMP, capstone.CS_GRP_CALL, capstone.CS_GRP_RET,
                          capstone.CS_GRP_INT, capstone.CS_GRP_IRET})


def _caller_slot(insn: capstone.CsInsn, state: _State) -> int:
    """Where the return address into the caller is, relative to rsp at this instruction."""
    raw = bytes(insn.bytes)
    if state.frame_set:
        return -1  # rbp is our frame: the kernel walk reaches the caller itself
    if state.sp_delta == 0 and (raw == b"\x55" or raw == ENDBR64):
        return -1  # the kernel reads [rsp] itself when a uprobe sits on push %rbp/endbr64
    return state.sp_delta


def _advance(insn: capstone.CsInsn, state: _State) -> bool:
    """Track the stack pointer; False when it changes in a way we cannot follow."""
    if insn.id == X.X86_INS_PUSH:
        state.sp_delta += 8
        if insn.operands[0].type == X.X86_OP_REG and insn.reg_name(insn.operands[0].reg) == "rbp":
            state.rbp_pushed = state.sp_delta == 8
        return True
    if insn.id == X.X86_INS_MOV and insn.op_str == "rbp, rsp" and state.rbp_pushed:
        state.frame_set = True
        return True
    if insn.id == X.X86_INS_SUB and insn.op_str.startswith("rsp, ") and \
            insn.operands[1].type == X.X86_OP_IMM:
        state.sp_delta += insn.operands[1].imm
        return True
    if "rsp" in _writes(insn) and not _ends_straight_line(insn):
        return False
    if "rbp" in _writes(insn):
        state.frame_set = False
        state.rbp_pushed = False
    return True


def choose(code: bytes, needed_args: set[int], needs_entry_sp: bool = False
           ) -> ProbePoint | Refusal:
    """Pick the probe offset in `code` (a function's first bytes).

    needed_args are 1-based argument indexes the probe reads; needs_entry_sp
    asks for a point where [rsp] is still the return address (return probes).
    """
    needed = {ARG_REGS[i - 1] for i in needed_args}
    state = _State()
    clobbered: set[str] = set()
    first_refusal = ""
    candidates: list[ProbePoint] = []
    for count, insn in enumerate(_disassembler().disasm(code, 0)):
        if count >= SCAN_LIMIT:
            break
        text = f"{insn.mnemonic} {insn.op_str}".strip()
        refusal = refused_reason(insn)
        if refusal:
            first_refusal = first_refusal or f"{refusal} instruction at +{insn.address} ({text})"
        lost = needed & clobbered
        if lost:
            break
        if refusal is None and (not needs_entry_sp or state.sp_delta == 0):
            candidates.append(ProbePoint(insn.address, text, cost_of(insn), "",
                                         _caller_slot(insn, state)))
        clobbered |= _writes(insn)
        if _ends_straight_line(insn) or not _advance(insn, state):
            break
    return _pick(candidates, first_refusal, needed, clobbered)


def _pick(candidates: list[ProbePoint], first_refusal: str, needed: set[str],
          clobbered: set[str]) -> ProbePoint | Refusal:
    if not candidates:
        why = first_refusal or "no instruction the kernel accepts"
        if needed & clobbered:
            why += f"; arguments {sorted(needed & clobbered)} are overwritten before any later one"
        return Refusal(f"no probeable instruction: {why}")
    rank = {COST_OPTIMIZED: 0, COST_EMULATED: 1, COST_SINGLE_STEP: 2}
    best = min(candidates, key=lambda p: (rank[p.cost], p.offset))
    if best.offset == 0:
        reason = f"entry instruction ({best.instruction}) is {best.cost}"
    elif first_refusal and candidates[0].offset == best.offset:
        reason = f"{first_refusal}; probing +{best.offset} ({best.instruction}, {best.cost})"
    else:
        reason = (f"+{best.offset} ({best.instruction}) is {best.cost} where earlier ones would "
                  f"be single-stepped; arguments still intact")
        if first_refusal:
            reason = f"{first_refusal}; {reason}"
    return ProbePoint(best.offset, best.instruction, best.cost, reason, best.caller_sp_offset)


def frame_setup(code: bytes) -> tuple[bool, bool]:
    """(sets up %rbp as frame pointer, calls anything) for one function body.

    gcc may schedule other instructions between `push %rbp` and
    `mov %rsp,%rbp` or shrink-wrap them behind an early-exit test, so the pair
    is looked for anywhere in the body rather than at the entry.
    """
    pushed = framed = calls = False
    # disasm_lite (no operand details) and an early stop: `check` samples 400 functions
    for _addr, _size, mnemonic, op_str in _disassembler().disasm_lite(code, 0):
        if mnemonic == "push" and op_str == "rbp":
            pushed = True
        elif pushed and mnemonic == "mov" and op_str == "rbp, rsp":
            framed = True
        elif mnemonic in ("call", "lcall"):
            calls = True
        if framed and calls:
            break
    return framed, calls


def call_sites(image: ElfImage, target: int, tail_calls: bool = False) -> list[int]:
    """Addresses of `call target` instructions (and, with `tail_calls`, of `jmp target`:
    gcc turns a call in tail position into a jump, as glibc 2.41's ld.so does for
    _dl_debug_state), each confirmed to be an instruction boundary by disassembling
    its function from the start (.eh_frame FDEs), since a uprobe placed inside an
    instruction would corrupt the code.  The kernel emulates both instructions."""
    opcodes = (b"\xe8", b"\xe9") if tail_calls else (b"\xe8",)
    candidates = []
    for seg in image.segments:
        if not seg.executable:
            continue
        code = image.code_at(seg.vaddr, seg.filesz)
        for opcode in opcodes:
            candidates += [seg.vaddr + i for i in _rel32_to(code, opcode, seg.vaddr, target)]
    wanted = {X.X86_INS_CALL, X.X86_INS_JMP} if tail_calls else {X.X86_INS_CALL}
    functions = fde_ranges(image)
    return sorted(c for c in candidates if _starts_instruction(image, functions, c, wanted))


def _rel32_to(code: bytes, opcode: bytes, vaddr: int, target: int) -> list[int]:
    """Offsets in `code` (at `vaddr`) of `opcode rel32` bytes that would reach `target`."""
    found = []
    i = code.find(opcode)
    while 0 <= i <= len(code) - 5:
        if vaddr + i + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True) == target:
            found.append(i)
        i = code.find(opcode, i + 1)
    return found


def _starts_instruction(image: ElfImage, functions: list[tuple[int, int]], addr: int,
                        wanted: set[int]) -> bool:
    for start, size in functions:
        if start <= addr < start + size:
            for insn in _disassembler().disasm(image.code_at(start, size), start):
                if insn.address >= addr:
                    return bool(insn.address == addr and insn.id in wanted)
            return False
    return False


def return_sites(code: bytes, start: int) -> list[int] | None:
    """The addresses of the `ret` instructions of a function whose code is `code` at
    `start`, by a linear sweep; None when a byte does not decode or no `ret` can
    take a probe.

    A uretprobe replaces the return address on the stack while the function runs,
    and glibc's dlsym reads its own return address to find its caller's object for
    RTLD_NEXT: under a return probe, dlsym(RTLD_NEXT, ...) returns NULL in every
    process on the host (Chromium aborts with "close symbol missing").  A plain
    probe on each `ret` sees the same result in rax and changes nothing.
    """
    rets, end = [], start
    for insn in _disassembler().disasm(code, start):
        end = insn.address + insn.size
        if insn.mnemonic == "ret" and refused_reason(insn) is None:
            rets.append(insn.address)
    return rets if rets and end == start + len(code) else None
