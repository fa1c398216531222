"""Function ranges from .eh_frame, reading only the FDE headers.

The call-site sweep needs every function's range, and .eh_frame has one FDE
per function.  pyelftools parses every FDE's call-frame instructions too:
2.8 s on the 1M-DIE benchmark binary (12 000 FDEs), most of a cold `check`.
This reads each entry's length, its CIE's pointer encoding and the FDE's
pc_begin/pc_range: milliseconds.  An encoding it does not know returns None
and the caller uses pyelftools.
"""

from __future__ import annotations

import struct

from refcntd.binary.abbrev import uleb128
from refcntd.binary.elf import ElfImage

_FORMATS = {0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q",
            0x00: "<Q"}  # DW_EH_PE_* value formats; 0x00 absptr is 8 bytes on x86-64
_PCREL, _ABS = 0x10, 0x00


class _Unsupported(ValueError):
    pass


def _encoded(data: bytes, pos: int, enc: int, vaddr: int) -> tuple[int, int]:
    """A DW_EH_PE-encoded pointer at `pos` (the field's address is vaddr + pos)."""
    fmt = _FORMATS.get(enc & 0x0F)
    if fmt is None or enc & 0x70 not in (_PCREL, _ABS) or enc & 0x80:
        raise _Unsupported(f"pointer encoding 0x{enc:x}")
    (value,) = struct.unpack_from(fmt, data, pos)
    if enc & 0x70 == _PCREL:
        value += vaddr + pos
    return value & 0xFFFFFFFFFFFFFFFF, pos + struct.calcsize(fmt)


def _cie_encoding(data: bytes, pos: int, end: int, vaddr: int) -> int:
    """The FDE pointer encoding ('R') of the CIE whose body starts at `pos`."""
    version = data[pos]
    pos += 1
    nul = data.index(b"\0", pos)
    aug = data[pos:nul].decode("ascii", "replace")
    pos = nul + 1
    if "eh" in aug:
        raise _Unsupported("eh augmentation")
    _, pos = uleb128(data, pos)  # code alignment
    _, pos = uleb128(data, pos)  # data alignment (sleb: only skipped)
    if version == 1:
        pos += 1
    else:
        _, pos = uleb128(data, pos)
    if not aug.startswith("z"):
        return _ABS
    _, pos = uleb128(data, pos)
    for ch in aug[1:]:
        if ch == "R":
            return data[pos]
        if ch == "P":
            enc = data[pos]
            _, pos = _encoded(data, pos + 1, enc & 0x7F, vaddr)
        elif ch == "L":
            pos += 1
        elif ch not in "SB":
            raise _Unsupported(f"augmentation {aug!r}")
        if pos > end:
            raise _Unsupported("CIE overrun")
    return _ABS


def fde_ranges(image: ElfImage) -> list[tuple[int, int]] | None:
    """(start, size) of every FDE in .eh_frame; [] without one; None if unsupported."""
    section = image.elffile().get_section_by_name(".eh_frame")
    if section is None:
        return []
    data, vaddr = section.data(), section["sh_addr"]
    out: list[tuple[int, int]] = []
    encodings: dict[int, int] = {}
    pos = 0
    try:
        while pos + 4 <= len(data):
            (length,) = struct.unpack_from("<I", data, pos)
            if length == 0:  # terminator
                break
            if length == 0xFFFFFFFF:
                raise _Unsupported("64-bit DWARF entry")
            body, end = pos + 4, pos + 4 + length
            (cie_ptr,) = struct.unpack_from("<I", data, body)
            if cie_ptr == 0:
                encodings[pos] = _cie_encoding(data, body + 4, end, vaddr)
            else:
                cie = body - cie_ptr
                if cie not in encodings:
                    raise _Unsupported(f"FDE at 0x{pos:x} before its CIE")
                enc = encodings[cie]
                start, at = _encoded(data, body + 4, enc, vaddr)
                size, _ = _encoded(data, at, enc & 0x0F, vaddr)
                out.append((start, size))
            pos = end
    except (_Unsupported, IndexError, struct.error, ValueError):
        return None
    return out
