"""Leaked and live objects by allocation stack in the folded-stack format.

One line per (process, type, allocation stack): `comm;main;...;alloc;type N`,
outermost frame first, the object count last: what flamegraph.pl, inferno
and speedscope read.  The type is the leaf, so one flame graph shows both
where objects are made and of what kind.
"""

from __future__ import annotations

from collections.abc import Iterable

from refcntd.analysis.model import ProcessSites, RunResult
from refcntd.symbolize.symbolizer import Frame


def _name(frame: Frame) -> str:
    text = frame.function or f"{frame.module.rsplit('/', 1)[-1]}+0x{frame.vaddr:x}"
    return text.replace(";", ":").replace(" ", "_").replace("\n", "_")


def folded(result: RunResult) -> str:
    """The folded text; objects of the same stack in several processes of one command add up."""
    return _lines((p.comm, g.frames, g.shown_type, len(g.objects))
                  for p in result.processes for g in p.groups)


def folded_sites(processes: list[ProcessSites], since: bool = False) -> str:
    """The same for the live objects the kernel counts per site (serve's /live, /diff)."""
    return _lines((p.comm, g.frames, g.type_name, g.since if since else g.live)
                  for p in processes for g in p.groups)


def _lines(rows: Iterable[tuple[str, tuple[Frame, ...], str, int]]) -> str:
    counts: dict[str, int] = {}
    for comm, stack, type_name, n in rows:
        root = (comm or "?").replace(";", ":").replace(" ", "_")
        frames = [_name(f) for f in reversed(stack)]
        leaf = f"[{type_name}]".replace(";", ":").replace(" ", "_")
        line = ";".join([root, *frames, leaf])
        counts[line] = counts.get(line, 0) + n
    return "".join(f"{line} {n}\n" for line, n in sorted(counts.items()) if n)
