"""Frames a tail call removed from a get/put's stack, put back where the code says.

`f() { ...; g(o); }` compiled to `jmp g` leaves f off the stack: g's frame
returns straight into f's caller.  That caller's return address follows a
`call f` instruction, so when the frame above it is not f, f was there and
jumped away: it is inserted (one level; a chain of tail calls shows its first).
Without it a consumer that hands the object to put by a tail call is invisible
and its caller is blamed for the reference it never held.
"""

from __future__ import annotations

from refcntd.symbolize.symbolizer import Frame, Symbolizer

CALL_REL32 = 0xE8  # call rel32: 5 bytes, the target relative to the next instruction
INFERRED = "tail call (inferred from the caller's call instruction)"


def with_tail_calls(frames: tuple[Frame, ...], sym: Symbolizer) -> tuple[Frame, ...]:
    out = list(frames[:1])
    for i in range(1, len(frames)):
        callee = _called(frames[i], sym)
        above = frames[i - 1]
        if callee is not None and callee.function and above.module == frames[i].module \
                and _base(callee.function) != _base(above.function):
            out.append(callee)
        out.append(frames[i])
    return tuple(out)


def _base(function: str) -> str:
    """foo for foo.cold, foo.part.0, foo.constprop.0: parts of one source function."""
    return function.split(".")[0]


def _called(ret: Frame, sym: Symbolizer) -> Frame | None:
    """The function a return address's call instruction called (direct calls only)."""
    mod = sym.module(ret.module) if ret.module else None
    if mod is None:
        return None
    code = mod.image.code_at(ret.vaddr - 5, 5)
    if len(code) != 5 or code[0] != CALL_REL32:
        return None
    target = ret.vaddr + int.from_bytes(code[1:], "little", signed=True)
    callee = sym.frame((ret.module, target), INFERRED, False)
    return Frame(callee.module, callee.vaddr, callee.function, callee.offset, raw=INFERRED)
