"""Frames a tail call removed from a get/put's stack, put back where the code says.

`f() { ...; g(o); }` compiled to `jmp g` leaves f off the stack: g's frame
returns straight into f's caller.  That caller's return address follows a
`call f` instruction, so when the frame above it is not f, f was there and
jumped away: it is inserted (one level; a chain of tail calls shows its first).
Without it a consumer that hands the object to put by a tail call is invisible
and its caller is blamed for the reference it never held.

f is often a static helper whose last statement calls into a library, `jmp
g@plt`: the frame above is then in another module, and still not f (f is in
the caller's module).  A call into the PLT itself (`call X@plt`) is a plain
call when the frame above is X; when it is not, X is put back only from the
module above when that module exports X as one plain function and the frame is
not in it.  An IFUNC (`memcpy` landing in `__memmove_avx_unaligned_erms`), X in
a third module or a call to code without a symbol leaves nothing certain, and
nothing is inserted.
"""

from __future__ import annotations

from refcntd.binary.callsites import plt_stub_names
from refcntd.symbolize.symbolizer import Frame, Symbolizer

STT_FUNC = 2  # an IFUNC (10) resolves to a function of another name
CALL_REL32 = 0xE8  # call rel32: 5 bytes, the target relative to the next instruction
INFERRED = "tail call (inferred from the caller's call instruction)"


def with_tail_calls(frames: tuple[Frame, ...], sym: Symbolizer) -> tuple[Frame, ...]:
    out = list(frames[:1])
    for i in range(1, len(frames)):
        callee = _jumped_away(frames[i], frames[i - 1], sym)
        if callee is not None:
            out.append(callee)
        out.append(frames[i])
    return tuple(out)


def _base(function: str) -> str:
    """foo for foo.cold, foo.part.0, foo.constprop.0: parts of one source function."""
    return function.split(".")[0]


def _jumped_away(ret: Frame, above: Frame, sym: Symbolizer) -> Frame | None:
    """The function `ret`'s call instruction called, when `above` shows it is no
    longer on the stack; None when it is, or when that cannot be told."""
    target = _call_target(ret, sym)
    if target is None or not above.module:
        return None
    imported = _plt_target(ret.module, target, sym)
    if imported is not None:
        return _imported(imported, above, sym) if imported else None
    callee = sym.frame((ret.module, target), INFERRED, False)
    if not callee.function or callee.offset or _base(callee.function) == _base(above.function):
        return None
    return Frame(callee.module, callee.vaddr, callee.function, 0, raw=INFERRED)


def _call_target(ret: Frame, sym: Symbolizer) -> int | None:
    """Where the direct call before return address `ret` went (None: no such call)."""
    mod = sym.module(ret.module) if ret.module else None
    if mod is None:
        return None
    code = mod.image.code_at(ret.vaddr - 5, 5)
    if len(code) != 5 or code[0] != CALL_REL32:
        return None
    return ret.vaddr + int.from_bytes(code[1:], "little", signed=True)


def _plt_target(module: str, target: int, sym: Symbolizer) -> str | None:
    """The imported function a call to `target` reaches through a PLT stub; "" for an
    address in the PLT sections that is no stub known (unsure); None: not the PLT."""
    mod = sym.module(module)
    if mod is None or not any(lo <= target < hi for lo, hi in mod.image.section_ranges(".plt")):
        return None
    return plt_stub_names(mod.image).get(target, "")


def _imported(name: str, above: Frame, sym: Symbolizer) -> Frame | None:
    """`name`, called through the PLT, when the module above exports it as exactly one
    plain function (no IFUNC, no second version) and the frame above is outside it."""
    if _base(name) == _base(above.function):
        return None  # the plain call
    mod = sym.module(above.module)
    rows = [r for r in mod.image.dynamic_symbols_named(name) if r.shndx] if mod else []
    if mod is None or len(rows) != 1 or rows[0].info & 0xF != STT_FUNC:
        return None
    start = rows[0].value
    size = next((s.size for s in mod.image.symbols.get(name, []) if s.vaddr == start), 0)
    if not size or start <= above.vaddr < start + size or above.vaddr - above.offset == start:
        return None  # its extent unknown, or the frame above is in it (an alias)
    return Frame(above.module, start, name, 0, raw=INFERRED)
