"""Static checks of a spec against the code it probes: calls that would count twice.

Found by reading the probed functions' direct calls (PLT stubs resolved):
a constructor that hands over to another listed constructor creates every
object twice, and a sink that calls the spec's own get function counts a
reference twice.  Both were real traps in GLib and GObject.

The same reading adapts a spec to the build it meets (`for_this_build`): an
entry's `skip_if_calls` leaves out its functions that call one of those names
in this build.  GLib 2.74 (Debian 12) makes every basic GVariant through
g_variant_new_from_bytes and its g_variant_ref_sink calls g_variant_ref; 2.84
(Debian 13) does neither, and cairo 1.18's cairo_pattern_create_rgb calls
cairo_pattern_create_rgba, which 1.16's does not.
"""

from __future__ import annotations

from dataclasses import replace

from refcntd.binary.elf import ElfImage
from refcntd.binary.specdraft import CallGraph
from refcntd.inputs.spec import RoleSpec, Spec


def for_this_build(spec: Spec, images: dict[str, str | None], load: dict[str, ElfImage]
                   ) -> tuple[Spec, list[str]]:
    """`spec` without the functions its entries' `skip_if_calls` leave out in these
    modules (an entry left with none is dropped), and a note for each left out."""
    if not any(e.skip_if_calls for e in spec.entries):
        return spec, []
    graphs: dict[str, CallGraph] = {}
    notes: list[str] = []
    roles: dict[str, tuple[RoleSpec, ...]] = {}
    for role, entries in spec.roles.items():
        kept = []
        for entry in entries:
            path = images.get(entry.library or "")
            if entry.skip_if_calls and path is not None and path in load:
                entry = _skipping(entry, graphs.setdefault(path, CallGraph(load[path])), notes)
            if entry.functions:
                kept.append(entry)
        if kept:
            roles[role] = tuple(kept)
    return replace(spec, roles=roles), notes


def _skipping(entry: RoleSpec, graph: CallGraph, notes: list[str]) -> RoleSpec:
    keep: list[str] = []
    skipped: list[str] = []
    for fn in entry.functions:
        (skipped if graph.targets(fn) & set(entry.skip_if_calls) else keep).append(fn)
    if not skipped:
        return entry
    notes.append(f"{entry.role}: {', '.join(skipped)} not probed: each calls "
                 f"{' or '.join(entry.skip_if_calls)} in this build (skip_if_calls), "
                 "which counts it")
    written = entry.written_at
    if len(written) == len(entry.functions):
        written = tuple(w for fn, w in zip(entry.functions, written, strict=True) if fn in keep)
    return replace(entry, functions=tuple(keep), written_at=written)


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
