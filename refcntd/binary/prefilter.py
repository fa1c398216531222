"""Which functions of a big module could mention a target at all.

Why: the call-site sweep decodes every instruction with capstone (about a
microsecond each from Python: 1.6 s for a 26 MiB executable), though only a
handful of functions ever name the probed functions.  An instruction can name
a target only through bytes of its own: a rel32 branch or a RIP-relative
displacement (target = end of instruction + disp32, the end being 0, 1, 2 or 4
bytes after the displacement), an absolute 32-bit immediate or displacement
(the target or its negation), a 16-bit one for targets below 64 KiB, or a
rel8 branch within 130 bytes of the target.  This test runs over every byte
offset at once (numpy), a superset of what the sweep can find: the sweep then
decodes only the functions with a hit, reads from Python only the instructions
holding one (batchdecode.py), and finds exactly what a full sweep finds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from refcntd.binary.elf import ElfImage

if TYPE_CHECKING:  # imported when needed: a small module's sweep never pays for numpy
    import numpy as np

MIN_CODE_BYTES = 1 << 20  # below this a full sweep is as fast as numpy's import
CHUNK = 1 << 22  # bytes per vectorised pass: bounded memory (about 100 MiB of temporaries)
SHF_EXECINSTR = 0x4
REL8_REACH = 130  # a rel8 branch reaches at most 129 bytes past its instruction
RIP_TAILS = (0, 1, 2, 4)  # bytes of immediate after a RIP-relative displacement


def code_bytes(image: ElfImage) -> int:
    return sum(s["sh_size"] for s in image.sections
               if s["sh_flags"] & SHF_EXECINSTR and s["sh_type"] != "SHT_NOBITS")


def hits(image: ElfImage, targets: Iterable[int]) -> np.ndarray:
    """Sorted addresses of the code bytes where an operand naming a target could begin
    (rel8 branches aside: see `candidates`)."""
    import numpy as np
    wanted = sorted(set(targets))
    rel = np.array(sorted({(t - k) & 0xFFFFFFFF for t in wanted for k in RIP_TAILS}),
                   dtype=np.uint32)
    absolute = np.array(sorted({t & 0xFFFFFFFF for t in wanted} |
                               {-t & 0xFFFFFFFF for t in wanted}), dtype=np.uint32)
    low = sorted({t & 0xFFFF for t in wanted if t < 0x10000} |
                 {-t & 0xFFFF for t in wanted if t < 0x10000})
    found = [np.zeros(0, dtype=np.uint64)]
    for section in image.sections:
        if not section["sh_flags"] & SHF_EXECINSTR or section["sh_type"] == "SHT_NOBITS":
            continue
        data, base = section.data(), section["sh_addr"]
        for start in range(0, len(data), CHUNK):
            chunk = np.frombuffer(data[start:start + CHUNK + 3], dtype=np.uint8)
            if len(chunk) < 4:
                continue
            b = chunk.astype(np.uint32)
            w32 = b[:-3] | (b[1:-2] << 8) | (b[2:-1] << 16) | (b[3:] << 24)
            pos = np.arange(len(w32), dtype=np.uint32) + np.uint32((base + start + 4)
                                                                     & 0xFFFFFFFF)
            mask = np.isin(pos + w32, rel) | np.isin(w32, absolute)  # wraps mod 2**32
            if low:
                w16 = (b[:-1] | (b[1:] << 8))[:len(w32)]
                mask |= np.isin(w16, np.array(low, dtype=np.uint32))
            found.append(np.flatnonzero(mask).astype(np.uint64) + np.uint64(base + start))
    return np.sort(np.concatenate(found))


def candidates(spans: Sequence[tuple[int, int]], hit_addresses: np.ndarray,
               targets: Iterable[int]) -> set[int]:
    """Indexes into `spans` ([start, end), sorted and disjoint: groups of overlapping
    functions) of those that may name a target: with a hit, or near enough a target
    for a rel8 branch to reach it."""
    import numpy as np
    starts = np.array([s for s, _ in spans], dtype=np.uint64)
    ends = np.array([e for _, e in spans], dtype=np.uint64)
    where = np.searchsorted(starts, hit_addresses, side="right") - 1
    inside = (where >= 0) & (hit_addresses < ends[np.maximum(where, 0)])
    found = set(where[inside].tolist())
    for t in set(targets):
        first = int(np.searchsorted(ends, max(t - REL8_REACH, 0), side="right"))
        found.update(range(first, int(np.searchsorted(starts, t + REL8_REACH))))
    return found
