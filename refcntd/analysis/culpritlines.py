"""The line, not only the function: where in a culprit's function its reference
came in, where released objects put such a reference there, and (a missing
put) the culprit's last call that touched the object, after which it was dropped.

A culprit's frame holds a return address inside the call that led to the
unmatched get (symbolized at the call itself, vaddr - 1).  The line table names
the innermost source line, which inside a `static inline` get wrapper is the
wrapper's; each frame of a culprit's paths is given instead the line in its own
function (Symbolizer.in_own_function), the line a developer would edit.  A
module without DWARF keeps no line: the function alone is named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from refcntd.analysis.model import LeakGroup
from refcntd.analysis.pathops import EXTRA_GET, Culprit, func_key
from refcntd.symbolize.exits import ExitWalk, own_line
from refcntd.symbolize.lines import Location
from refcntd.symbolize.symbolizer import Frame, Symbolizer


def place_lines(groups: Iterable[LeakGroup], sym: Symbolizer) -> None:
    """Give every culprit's frames the line in their own function."""
    seen: dict[Frame, Frame] = {}

    def own(frame: Frame) -> Frame:
        if frame not in seen:
            seen[frame] = sym.in_own_function(frame)
        return seen[frame]

    for group in groups:
        for c in group.culprits:
            c.function = own(c.function)
            c.frames = tuple(map(own, c.frames))
            c.expected = tuple(map(own, c.expected))
            c.last_use = tuple(map(own, c.last_use))
            c.exits = early_exits(c, sym)


def early_exits(c: Culprit, sym: Symbolizer) -> tuple[Frame, ...]:
    """A missing put whose function released objects put such a reference in: where
    its code skips those puts (symbolize/exits.py), one frame per line."""
    f = c.function
    mod = sym.module_of(f) if c.kind != EXTRA_GET and not c.baseline else None
    key = func_key(f)
    puts = {e.vaddr for e in c.expected if e.function and func_key(e) == key}
    if mod is None or not puts or not f.offset:
        return ()
    found = ExitWalk(mod, f.function, puts).skipped(f.vaddr)
    line = own_line(mod, f.function)
    out: dict[Location, Frame] = {}
    for addr in found or ():
        file, number = line(addr)
        if file and (file, number) not in out:
            out[(file, number)] = replace(f, vaddr=addr, offset=f.offset + addr - f.vaddr,
                                          file=file, line=number)
    return tuple(out.values())


def culprit_line(c: Culprit) -> Location | None:
    """(file, line) in the culprit's function of the call its reference came through
    (an extra get: the call that took it), None without DWARF."""
    f = c.function
    return (f.file, f.line) if f.function and f.file and f.line else None


def put_line(c: Culprit) -> Location | None:
    """A missing put: where in the culprit's function released objects put such a
    reference (the call toward the put on the expected path), when they did there."""
    if c.kind == EXTRA_GET or not c.function.function:
        return None
    key = func_key(c.function)
    f = next((f for f in c.expected if f.function and func_key(f) == key), None)
    return (f.file, f.line) if f is not None and f.file and f.line else None


def exit_lines(c: Culprit) -> list[Location]:
    """A missing put: the lines where the culprit's function skips it."""
    return [(f.file, f.line) for f in c.exits if f.file and f.line]


def last_use_line(c: Culprit) -> tuple[Location, str] | None:
    """A missing put: the line in the culprit's function of its last call that
    touched the object on this path (the put is missing after it), and the function
    it called there; None without timed history or DWARF."""
    if c.kind == EXTRA_GET or not c.last_use:
        return None
    f = c.last_use[-1]
    callee = c.last_use[-2].function if len(c.last_use) > 1 else ""
    return ((f.file, f.line), callee or "??") if f.function and f.file and f.line else None


def where(location: Location | None, full: bool = False) -> str:
    """`file.c:12` (the base name unless `full`), "" when unknown."""
    if location is None:
        return ""
    file = location[0] if full else location[0].rsplit("/", 1)[-1]
    return f"{file}:{location[1]}"
