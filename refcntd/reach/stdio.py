"""stdio's buffers hold characters, never pointers: their words are no edges.

A FILE's buffer is a malloc block that stdio fills from its start; the bytes no
character reached are what malloc handed out, often a freed chunk's links or a
dead copy of a pointer.  At exit, `_IO_cleanup` unbuffers each stream and keeps its
buffer in `_freeres_buf` (for `__libc_freeres`), so a program that printed less than
a buffer's worth (4 KiB to a pipe or file) keeps those bytes reachable from
`_IO_2_1_stdout_` to the end.  Seen on Debian 13 (glibc 2.41): a freed chunk's
`fd` there was the address of a lost GstCaps made later in the same place, which
then looked still reachable; valgrind never sees it (its malloc does not reuse a
block so soon).  The streams are read from `_IO_list_all` through `_chain`; the
fields are those of glibc's public `struct _IO_FILE` (x86-64), the same since 2.2.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from refcntd.reach.graph import Words
from refcntd.reach.memory import ProcessMemory
from refcntd.reach.roots import Root, data_symbols

BUF_BASE, BUF_END, CHAIN, FREERES_BUF = 7, 8, 13, 22  # word indices in struct _IO_FILE
FILE_WORDS = 23
MAX_STREAMS = 1 << 12  # streams followed: a torn chain ends


def read_buffers(mem: ProcessMemory, roots: list[Root]) -> list[tuple[int, int]]:
    """While the process is stopped: each stream's buffer, (start, end) of the bytes in
    use, and its kept `_freeres_buf` as (start, start): its block decides where it ends
    (`drop_words`)."""
    head = _list_head(roots)
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    fp = mem.word(head) if head else None
    while fp and fp not in seen and len(seen) < MAX_STREAMS:
        seen.add(fp)
        fields = mem.words(fp, FILE_WORDS)
        if fields is None:
            break
        base, end = fields[BUF_BASE], fields[BUF_END]
        if base and end - base > 1 and not fp <= base < fp + 8 * FILE_WORDS:  # not the
            out.append((base, end))  # one-byte `_shortbuf` of an unbuffered stream
        if fields[FREERES_BUF]:
            out.append((fields[FREERES_BUF], fields[FREERES_BUF]))
        fp = fields[CHAIN]
    return out


def _list_head(roots: list[Root]) -> int | None:
    for root in roots:
        if root.what == "module" and Path(root.owner).name.startswith("libc.so"):
            offset = _symbol(root.owner, "_IO_list_all")
            return root.base + offset if offset is not None else None
    return None


@cache
def _symbol(path: str, name: str) -> int | None:
    return next((a for a, n, _ in data_symbols(path) if n == name), None)


def drop_words(words: Words, buffers: list[tuple[int, int]], starts: np.ndarray,
               tails: np.ndarray) -> int:
    """Leave out of `words` those inside a buffer (a heap block's buffer to the block's
    tail: the bytes past the text included); how many were left out."""
    spans = sorted(_spans(buffers, starts, tails))
    if not spans:
        return 0
    lo = np.array([s for s, _ in spans], np.uint64)
    hi = np.array([e for _, e in spans], np.uint64)
    dropped = 0
    for i, where in enumerate(words.where):
        at = np.searchsorted(lo, where, side="right") - 1
        inside = (at >= 0) & (where < hi[np.maximum(at, 0)])
        if inside.any():
            dropped += int(np.count_nonzero(inside))
            words.where[i], words.values[i] = where[~inside], words.values[i][~inside]
    return dropped


def _spans(buffers: list[tuple[int, int]], starts: np.ndarray,
           tails: np.ndarray) -> list[tuple[int, int]]:
    out: dict[int, int] = {}
    for start, end in buffers:
        i = int(np.searchsorted(starts, np.uint64(start)))
        if i < len(starts) and int(starts[i]) == start:
            end = max(end, int(tails[i]))
        if end > start:
            out[start] = max(out.get(start, 0), end)
    return list(out.items())
