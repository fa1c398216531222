"""Static checks of a spec against the code it probes: calls that would count twice.

Found by reading the probed functions' direct calls (PLT stubs resolved):
a constructor that hands over to another listed constructor creates every
object twice, and a sink that calls the spec's own get function counts a
reference twice.  Both were real traps in GLib and GObject.
"""

from __future__ import annotations

from refcntd.binary.elf import ElfImage
from refcntd.binary.specdraft import CallGraph
from refcntd.inputs.spec import Spec


def double_counts(spec: Spec, images: dict[str, str | None], load: dict[str, ElfImage]
                  ) -> list[str]:
    """Problems, one line each.  `images` maps each entry's library (None: the
    executable) to its module path; `load` maps module paths to parsed images."""
    graphs: dict[str, CallGraph] = {}
    problems: list[str] = []

    def graph(lib: str | None) -> CallGraph | None:
        path = images.get(lib or "")
        if path is None or path not in load:
            return None
        return graphs.setdefault(path, CallGraph(load[path]))

    for entry in spec.roles.get("init", ()):  # one entry: one kind of object
        g = graph(entry.library)
        listed = set(entry.functions)
        for fn in entry.functions:
            for other in sorted(g.targets(fn) & listed - {fn}) if g else ():
                problems.append(f"init: {fn} hands over to {other}, both listed: each object "
                                f"would be created twice; keep {other} only")
    gets = {f for e in spec.roles.get("get", ()) for f in e.functions}
    for entry in spec.roles.get("sink", ()):
        g = graph(entry.library)
        for fn in entry.functions:
            for get in sorted(g.targets(fn) & gets) if g else ():
                problems.append(f"sink: {fn} calls {get} itself, which the get role already "
                                "counts: drop the sink role for it")
    return problems
