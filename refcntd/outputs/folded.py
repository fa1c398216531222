"""Leaked and live objects by allocation stack in the folded-stack format.

One line per (process, type, allocation stack): `comm;main;...;alloc;type N`,
outermost frame first, the object count last: what flamegraph.pl, inferno
and speedscope read.  The type is the leaf, so one flame graph shows both
where objects are made and of what kind.
"""

from __future__ import annotations

from refcntd.analysis.model import RunResult
from refcntd.symbolize.symbolizer import Frame


def _name(frame: Frame) -> str:
    text = frame.function or f"{frame.module.rsplit('/', 1)[-1]}+0x{frame.vaddr:x}"
    return text.replace(";", ":").replace(" ", "_").replace("\n", "_")


def folded(result: RunResult) -> str:
    """The folded text; objects of the same stack in several processes of one command add up."""
    counts: dict[str, int] = {}
    for process in result.processes:
        root = (process.comm or "?").replace(";", ":").replace(" ", "_")
        for group in process.groups:
            frames = [_name(f) for f in reversed(group.frames)]
            leaf = f"[{group.type_name}]".replace(";", ":").replace(" ", "_")
            line = ";".join([root, *frames, leaf])
            counts[line] = counts.get(line, 0) + len(group.objects)
    return "".join(f"{line} {n}\n" for line, n in sorted(counts.items()))
