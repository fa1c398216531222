"""Decode a big module's functions with capstone's C decoder and read the result with numpy.

Why: the call-site sweep needs every instruction of a function that may call
a probed function: where instructions begin, which addresses direct branches
reach, whether an indirect jump (a jump table) makes any address a target.
Reading capstone's answer one instruction at a time from Python costs about
1.5 us an instruction (1.4 s on a 26 MiB executable); the C decoder alone
costs 0.35 us.  Here numpy reads capstone's instruction array in batches,
and Python sees only the instructions that may name a target: a direct
branch to one (rel8 ones included), or one whose bytes hold a prefilter hit
(prefilter.py: a superset of any address an operand can name).  The sweep
classifies those exactly as it classifies every instruction of a small
module; tests compare the two on Debian's libraries and on hostile code.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Iterator, Sequence

import capstone
import numpy as np

from refcntd.binary.callsites import Decoded
from refcntd.binary.elf import ElfImage

_INSN = capstone._cs_insn  # the C struct cs_disasm fills (capstone's own ctypes mirror)
_STRIDE = ctypes.sizeof(_INSN)
_AT = {name: getattr(_INSN, name).offset for name in ("id", "address", "size", "mnemonic",
                                                       "op_str")}
_HEX_DIGITS = 16  # of a 64-bit address
BATCH_ROWS = 1 << 16  # instructions per numpy pass (16 MiB of capstone records)
_HEX = np.full(256, -1, dtype=np.int64)
_HEX[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16)


class BatchDecoder:
    """Decodes (start, size) ranges of one module for one set of target addresses."""

    def __init__(self, md: capstone.Cs, image: ElfImage, hit_addresses: np.ndarray,
                 targets: Iterable[int]) -> None:
        self.md, self.image, self.hits = md, image, hit_addresses
        self.targets = np.array(sorted(set(targets)), dtype=np.uint64)
        names = [md.insn_name(i) or "" for i in range(capstone.x86.X86_INS_ENDING)]
        # the last word of a mnemonic ("bnd jmp", "notrack jmp") is its instruction's name
        self._branch = np.array([n in ("call", "jmp") or n.startswith("j") for n in names])
        self._jmp = np.array([n.endswith("jmp") for n in names])

    def decode(self, functions: Iterable[tuple[int, int]]) -> Iterator[Decoded]:
        """One Decoded per range, in order; memory bounded by BATCH_ROWS."""
        batch: list[tuple[int, int]] = []
        records: list[bytes] = []
        rows = 0
        for start, size in functions:
            raw = self._disasm(start, size)
            batch.append((start, size))
            records.append(raw)
            rows += len(raw) // _STRIDE
            if rows >= BATCH_ROWS:
                yield from self._read(batch, records)
                batch, records, rows = [], [], 0
        if batch:
            yield from self._read(batch, records)

    def _disasm(self, start: int, size: int) -> bytes:
        """capstone's records for the range, copied out of its buffer (stops where it cannot
        decode, as Cs.disasm does)."""
        code = self.image.code_at(start, size)
        insns = ctypes.POINTER(_INSN)()
        count = capstone._cs.cs_disasm(self.md.csh, code, len(code), start, 0,
                                       ctypes.byref(insns))
        if count <= 0:
            return b""
        try:
            return ctypes.string_at(insns, count * _STRIDE)
        finally:
            capstone._cs.cs_free(insns, count)

    def _read(self, batch: Sequence[tuple[int, int]], records: list[bytes]
              ) -> Iterator[Decoded]:
        counts = np.array([len(r) // _STRIDE for r in records], dtype=np.int64)
        rec = np.frombuffer(b"".join(records), dtype=np.uint8).reshape(-1, _STRIDE)
        ids = _field(rec, "id", "<u4").astype(np.int64)
        addr = _field(rec, "address", "<u8")
        end = addr + _field(rec, "size", "<u2").astype(np.uint64)
        ops = rec[:, _AT["op_str"]:_AT["op_str"] + 2 + _HEX_DIGITS + 1]
        starts_hex = (ops[:, 0] == ord("0")) & (ops[:, 1] == ord("x"))
        known = ids < len(self._branch)
        named = np.where(known, ids, 0)
        jumps = known & self._jmp[named] & ~starts_hex
        branch = np.flatnonzero(known & self._branch[named] & starts_hex)
        value, bare = _hex_numbers(ops[branch, 2:])
        branch, value = branch[bare], value[bare]
        to_target = np.zeros(len(rec), dtype=bool)
        to_target[branch[np.isin(value, self.targets)]] = True
        # Python reads what may name a target; an instruction it finds nothing in is a no-op
        picked = np.flatnonzero(to_target | self._has_hit(addr, end))
        first = np.concatenate(([0], np.cumsum(counts)))
        starts = np.array([s for s, _ in batch], dtype=np.uint64)
        ends = np.where(counts > 0, end[np.maximum(first[1:] - 1, 0)], starts)
        jumps_before = np.concatenate(([0], np.cumsum(jumps)))
        indirect = (jumps_before[first[1:]] > jumps_before[first[:-1]]).tolist()
        rows_at = np.searchsorted(picked, first).tolist()  # function i: rows_at[i:i + 2]
        branches_at = np.searchsorted(branch, first).tolist()
        rows = [_row(rec[j], int(addr[j]), int(end[j] - addr[j])) for j in picked]
        values = value.tolist()
        for i, function_end in enumerate(ends.tolist()):
            mine = rows[rows_at[i]:rows_at[i + 1]]
            yield Decoded(function_end, indirect[i],
                          frozenset(values[branches_at[i]:branches_at[i + 1]] if mine else ()),
                          mine)

    def _has_hit(self, addr: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Whether a prefilter hit lies in [addr, end) of each instruction."""
        if not len(self.hits):
            return np.zeros(len(addr), dtype=bool)
        i = np.searchsorted(self.hits, addr)
        return (i < len(self.hits)) & (self.hits[np.minimum(i, len(self.hits) - 1)] < end)


def _hex_numbers(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of `0x...` operand texts (the columns after "0x") and whether each was a bare
    number: hex digits up to the NUL (a direct branch's target; anything else is not)."""
    values = _HEX[digits]
    value = np.zeros(len(digits), dtype=np.uint64)
    going = np.ones(len(digits), dtype=bool)
    bare = np.zeros(len(digits), dtype=bool)
    for column, chars in zip(values.T, digits.T, strict=True):
        bare |= going & (chars == 0)
        going &= column >= 0
        value = np.where(going, value * np.uint64(16) + np.maximum(column, 0).astype(np.uint64),
                         value)
    return value, bare


def _field(rec: np.ndarray, name: str, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return rec[:, _AT[name]:_AT[name] + width].copy().view(dtype).ravel()


def _row(record: np.ndarray, address: int, size: int) -> tuple[int, int, str, str]:
    raw = record.tobytes()

    def text(name: str, width: int) -> str:
        return raw[_AT[name]:_AT[name] + width].split(b"\0", 1)[0].decode("ascii")
    return address, size, text("mnemonic", 32), text("op_str", 160)
