"""Probe-point choice on hand-assembled instruction bytes (pure logic)."""

from __future__ import annotations

from refcntd.binary.elf import ElfImage
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.probepoint import (
    COST_EMULATED,
    COST_OPTIMIZED,
    COST_SINGLE_STEP,
    ProbePoint,
    Refusal,
    choose,
    return_sites,
)

LOCK_ADD_RDI = bytes.fromhex("f0830701")  # lock addl $1,(%rdi)
RET = b"\xc3"
PUSH_RBP_MOV = bytes.fromhex("554889e5")  # push %rbp; mov %rsp,%rbp
XCHG_ESI_RDI = bytes.fromhex("8737")  # xchg %esi,(%rdi)
NOP5 = bytes.fromhex("0f1f440000")
MOV_ESI_1 = bytes.fromhex("be01000000")  # mov $1,%esi


def test_lock_prefixed_entry_moves_to_the_ret():
    p = choose(LOCK_ADD_RDI + RET, {2})
    assert isinstance(p, ProbePoint)
    assert (p.offset, p.cost, p.caller_sp_offset) == (4, COST_SINGLE_STEP, 0)
    assert "lock-prefixed instruction at +0" in p.reason and "probing +4" in p.reason


def test_push_rbp_entry_is_emulated_and_kernel_walk_has_the_caller():
    p = choose(PUSH_RBP_MOV + LOCK_ADD_RDI + b"\x5d" + RET, {1, 2, 3})
    assert (p.offset, p.cost, p.caller_sp_offset) == (0, COST_EMULATED, -1)


def test_an_exact_five_byte_nop_is_preferred():
    p = choose(b"\x48\x89\xf8" + NOP5 + RET, {1})  # mov %rdi,%rax; nop5; ret
    assert (p.offset, p.cost) == (3, COST_OPTIMIZED)


def test_argument_overwritten_before_any_acceptable_point_is_refused():
    # lock xadd %esi,(%rdi) is refused and overwrites argument 2; the ret comes too late
    r = choose(bytes.fromhex("f00fc137") + RET, {2})
    assert isinstance(r, Refusal)
    assert "lock-prefixed" in r.reason and "rsi" in r.reason


def test_probing_on_the_clobbering_instruction_still_sees_the_argument():
    p = choose(LOCK_ADD_RDI + MOV_ESI_1 + RET, {2})
    assert (p.offset, p.instruction) == (4, "mov esi, 1")


def test_xchg_entry_is_accepted_but_single_stepped():
    p = choose(XCHG_ESI_RDI + RET, {2, 3, 4})
    assert (p.offset, p.cost) == (0, COST_SINGLE_STEP)


def test_segment_prefixed_instruction_is_skipped():
    fs_load = bytes.fromhex("648b0425" "28000000")  # mov %fs:0x28,%eax
    p = choose(fs_load + RET, {1})
    assert p.offset == len(fs_load) and "fs segment" in p.reason


def test_return_probe_needs_the_return_address_on_top():
    # push %rbx; lock add; pop %rbx; ret: after the push, [rsp] is no longer the return address
    r = choose(b"\x53" + LOCK_ADD_RDI + b"\x5b" + RET, set(), needs_entry_sp=True)
    assert isinstance(r, ProbePoint) and r.offset == 0


def test_caller_slot_tracks_pushes_before_the_probe():
    # push %rbx (emulated at +0 is best) -- force later: lock at +0, then push, ret
    code = LOCK_ADD_RDI + b"\x53" + RET
    p = choose(code, {1})
    assert (p.offset, p.cost, p.caller_sp_offset) == (4, COST_EMULATED, 0)


def test_stops_at_the_first_branch():
    # lock add; jmp +0; then an emulated push that is not straight-line reachable
    code = LOCK_ADD_RDI + b"\xeb\x00" + b"\x53" + RET
    p = choose(code, {1})
    assert p.offset == 4  # the jmp itself, never beyond it


def test_return_sites_are_every_ret_of_the_function():
    # c3 inside mov's immediate is no ret; the two real ones are
    code = PUSH_RBP_MOV + bytes.fromhex("b8c3000000") + b"\x5d" + RET + b"\x5d" + RET
    assert return_sites(code, 0x1000) == [0x1000 + 10, 0x1000 + 12]


def test_return_sites_refuse_what_does_not_decode_or_has_no_ret():
    assert return_sites(PUSH_RBP_MOV + b"\x06", 0) is None  # 0x06 is invalid in 64-bit
    assert return_sites(PUSH_RBP_MOV + b"\x5d", 0) is None


def test_debians_dlsym_has_a_ret_to_probe():
    """What the dlsym probe uses instead of a return probe (which breaks RTLD_NEXT):
    Debian's libc's dlsym decodes to its end and has a `ret`."""
    libc = ElfImage(resolve_library("libc.so.6", ElfImage("/bin/true")))
    (sym, *_) = libc.symbols["dlsym"]
    rets = return_sites(libc.code_at(sym.vaddr, sym.size), sym.vaddr)
    assert rets and all(sym.vaddr < r < sym.vaddr + sym.size for r in rets)
    assert all(libc.code_at(r, 1) == RET for r in rets)
