"""Render a RunResult as LeakSanitizer-style text (its JSON: reportjson.py)."""

from __future__ import annotations

import shlex

from refcntd.analysis.culpritlines import (
    culprit_line,
    exit_lines,
    last_use_line,
    put_line,
    where,
)
from refcntd.analysis.model import (
    STATE_EXITED,
    STATE_LIVE_AT_DETACH,
    AnomalyFinding,
    LeakedObject,
    LeakGroup,
    ProcessReport,
    ProcessSites,
    RunResult,
    StackUnwind,
    TracingStatus,
    owned_objects,
)
from refcntd.analysis.pathops import Culprit
from refcntd.reach.scan import REACHABLE
from refcntd.symbolize.symbolizer import Frame
from refcntd.text import visible

MAX_LISTED_OBJECTS = 8


def _plural(n: int, word: str) -> str:
    plural = word[:-1] + "ies" if word.endswith("y") else word + (
        "es" if word.endswith("s") else "s")
    return f"{n} {word if n == 1 else plural}"


def _age(ns: int) -> str:
    if ns >= 10**9:
        return f"{ns / 1e9:.1f} s"
    return f"{ns / 1e6:.1f} ms"


def process_header(p: ProcessReport) -> str:
    command = shlex.join(p.command) if p.command else p.comm
    status = f", {p.status_text}" if p.status_text else ""
    return f"==={p.pid}=== {p.state}{status}: {command}"


def render_process(p: ProcessReport) -> str:
    lines = [process_header(p)]
    for finding in p.anomalies:
        lines += ["", *render_anomaly(finding)]
    word = "live" if p.state == STATE_LIVE_AT_DETACH else "leaked"
    held = _held_objects(p)
    for group in _owners_first(p.groups):
        lines += ["", *render_group(group, word)]
        lines += render_held(group, held.get(id(group), []))
    if p.kept:
        lines += ["", *(f"kept by the library on purpose (spec default, not a leak): "
                        f"{_plural(n, 'object')}: {reason}" for reason, n in p.kept.items())]
    lines += ["", summary_line(p)]
    lines += [f"  note: {note}" for note in p.notes]
    return "\n".join(visible(line) for line in lines) + "\n"


def _held_objects(p: ProcessReport) -> dict[int, list[tuple[LeakGroup, int]]]:
    """id(group) -> (group, address) of the objects its objects hold."""
    group_of = {o.address: g for g in p.groups for o in owned_objects(g)}
    out: dict[int, list[tuple[LeakGroup, int]]] = {}
    for g in p.groups:
        for o in owned_objects(g):
            for holder in {h.address for h in o.held_by}:
                if holder in group_of:
                    out.setdefault(id(group_of[holder]), []).append((g, o.address))
    return out


def _owners_first(groups: list[LeakGroup]) -> list[LeakGroup]:
    """Each indirect group right after the group of its first holder."""
    group_of = {o.address: g for g in groups for o in owned_objects(g)}
    after: dict[int, list[LeakGroup]] = {}
    top = []
    for g in groups:
        holders = [h.address for o in owned_objects(g) for h in o.held_by
                   if h.address in group_of]
        owner = group_of.get(holders[0]) if holders else None
        if g.verdict is not None and g.verdict.status == "indirect" and owner is not None \
                and owner is not g:
            after.setdefault(id(owner), []).append(g)
        else:
            top.append(g)
    out: list[LeakGroup] = []
    todo = list(reversed(top))
    while todo:
        g = todo.pop()
        if g in out:
            continue
        out.append(g)
        todo += reversed(after.get(id(g), []))
    return out + [g for g in groups if g not in out]


def render_sites(p: ProcessSites, since: bool) -> str:
    """A process's live objects per allocation site; `since`: those created since the
    checkpoint (a diff), with their mean age."""
    command = shlex.join(p.command) if p.command else p.comm
    state = "live, created since the checkpoint" if since else "live"
    lines = [f"==={p.pid}=== {state}: {command}"]
    for g in p.groups:
        if since:
            head = (f"{_plural(g.since, 'object')} of type '{g.type_name}' created since the "
                    f"checkpoint and live (mean age {_age(g.since_mean_age_ns)}; "
                    f"{g.live} live, {g.created} created here in all), allocated at:")
        else:
            head = (f"{_plural(g.live, 'live object')} of type '{g.type_name}' "
                    f"({g.created} created here), allocated at:")
        lines += ["", head, *(f"    #{i} {f.describe()}" for i, f in enumerate(g.frames))]
        lines += truncation_line(g.unwind)
    total = sum(g.since if since else g.live for g in p.groups)
    lines += ["", f"SUMMARY: {_plural(total, 'object')} in {_plural(len(p.groups), 'site')}"]
    return "\n".join(visible(line) for line in lines) + "\n"


def render_anomaly(a: AnomalyFinding) -> list[str]:
    label = "NOTE" if a.separate else "ANOMALY"
    times = f", {_plural(a.occurrences, 'time')}" if a.occurrences > 1 else ""
    count = f", count {a.count_before} before" if a.kind in ("double-put", "negative-count",
                                                              "delete-live") else ""
    lines = [f"{label} {a.kind}: {a.description}",
             f"  object 0x{a.address:x} of type '{a.type_name}'{count}{times}, at:"]
    lines += [f"    #{i} {frame.describe()}" for i, frame in enumerate(a.frames)]
    lines += truncation_line(a.unwind)
    if a.alloc_frames:
        lines.append("  allocated at:")
        lines += [f"    #{i} {frame.describe()}" for i, frame in enumerate(a.alloc_frames)]
        lines += truncation_line(a.alloc_unwind)
    return lines


def truncation_line(u: StackUnwind) -> list[str]:
    """Under a stack the walk cut short: where and why (nothing for a whole stack)."""
    return [f"    (stack {u.describe()})"] if u.truncated_at is not None else []


def render_group(g: LeakGroup, word: str) -> list[str]:
    counts = g.objects.counts() if hasattr(g.objects, "counts") else \
        sorted({o.count for o in g.objects})  # drained as columns: without an object each
    count_text = ", ".join(str(c) for c in counts)
    kind = "Indirectly leaked" if g.verdict and g.verdict.status == "indirect" else \
        word.capitalize()
    kind = f"{kind} ({g.kind})" if g.kind else kind  # --leak-kinds
    counted = "count now" if word == "live" else "final count"  # live at detach: not final
    of_class = f" class '{g.class_name}'" if g.class_name else ""
    lines = [f"{kind} {_plural(len(g.objects), 'object')} of type '{g.type_name}'{of_class} "
             f"({counted} {count_text}) allocated at:"]
    lines += [f"    #{i} {frame.describe()}" for i, frame in enumerate(g.frames)]
    lines += truncation_line(g.unwind)
    if g.unwind.truncated_at is None and g.stack_truncated:
        lines.append("    (stack likely truncated: it does not reach main or a thread start)")
    lines += render_culprits(g, word)
    for obj in g.objects[:MAX_LISTED_OBJECTS]:
        lines.append(f"  object 0x{obj.address:x}: count {obj.count}, {obj.gets} gets, "
                     f"{obj.puts} puts, age {_age(obj.age_ns)}"
                     + (f", {_root_text(obj.root)}" if obj.root else ""))
        lines += render_holders(obj)
        lines += render_history(obj)
    if len(g.objects) > MAX_LISTED_OBJECTS:
        lines.append(f"  ... and {len(g.objects) - MAX_LISTED_OBJECTS} more objects")
    return lines


HOLDERS_LISTED = 3


def render_holders(obj: LeakedObject) -> list[str]:
    """Who holds its references at the scan (reach/holders.py): the references nobody
    holds first, then the first holders, then pointers that hold none, and why."""
    if obj.holders < 0:
        return []
    counted = [p.holder for p in obj.pointers if p.counted]
    listed = ", ".join(counted[:HOLDERS_LISTED]) + \
        (f", ... {obj.holders - HOLDERS_LISTED} more" if obj.holders > HOLDERS_LISTED else "")
    lines = []
    held = f"{_plural(obj.holders, 'holder')} ({listed})" if obj.holders else "no holder"
    if obj.unheld and obj.kind == REACHABLE:  # holders.judged_unheld said no
        lines.append(f"    {_plural(obj.unheld, 'reference')} held by no slot seen: count "
                     f"{obj.count}, {held}; not judged: other threads' registers are not "
                     "read, and a reference kept only there looks so")
    elif obj.unheld:
        lines.append(f"    {_plural(obj.unheld, 'reference')} held by nothing: count "
                     f"{obj.count}, {held}")
    elif obj.holders:
        lines.append(f"    held by {_plural(obj.holders, 'slot')}: {listed}")
    if obj.unheld:  # why a pointer left is no holder: only where a reference is missing
        lines += [f"    not a holder: {p.holder} ({p.why})"
                  for p in obj.pointers if not p.counted][:HOLDERS_LISTED]
    return lines


def _root_text(root: str) -> str:
    """--leak-kinds: `reachable from global x (prog)`, or `lost with 0x.. (type)`."""
    return root if root.startswith("lost with") else f"reachable from {root}"


def short_path(frames: tuple[Frame, ...], limit: int = 4) -> str:
    """`f1+0x1 (file.c:12) < f2 < f3`: where an operation happened, innermost first."""
    if not frames:
        return "?"
    parts = [f.function or f"0x{f.vaddr:x}" for f in frames[:limit]]
    first = frames[0]
    parts[0] += f"+0x{first.offset:x}" if first.function else ""
    if first.file:
        parts[0] += f" ({first.file.rsplit('/', 1)[-1]}:{first.line})"
    return " < ".join(parts) + (" < ..." if len(frames) > limit else "")


def render_culprits(g: LeakGroup, word: str = "leaked") -> list[str]:
    """`word`: "live" for objects still live at detach: not (yet) leaks."""
    v = g.verdict
    lines = []
    if v is not None and v.status == "unknown":
        return [f"  Culprit unknown: {v.reason}", *(f"    note: {n}" for n in v.notes)]
    if v is not None and v.status in ("indirect", "cycle"):
        label = "Indirect leak" if v.status == "indirect" else "Leak cycle"
        lines.append(f"  {label}: {v.reason}")
        lines += [f"    held by {h.type_name or '?'} 0x{h.address:x}: "
                  f"{_plural(h.references, 'reference')} got at {short_path(h.frames)}"
                  for o in g.objects[:MAX_LISTED_OBJECTS] for h in o.held_by]
        lines += [f"    culprit of {c.holder}: {c.kind} in {named(c)}: "
                  f"the reference got at {short_path(c.frames, 8)} is never put"
                  for c in g.culprits]
        return lines
    if v is not None and v.status == "tie":
        lines.append(f"  Culprit tie: {v.reason}")
    for rank, c in enumerate(g.culprits):
        label = "Candidate" if c.tie else "Likely culprit" if rank == 0 else "Also"
        if c.baseline:
            lines += [f"  {label}: {c.kind} in {named(c)}, found against {c.baseline}",
                      f"    why: {c.why}", named_by(c),
                      f"    the call: {short_path(c.frames, 8)}"]
            continue
        handed = "" if c.function in c.frames else \
            f", handed to {c.function.function or '??'},"
        lines.append(f"  {label}: {c.kind} in {named(c)}: the reference "
                     f"got at {short_path(c.frames, 8)}{handed} is never put")
        if c.why:
            lines.append(f"    why: {c.why}")
        lines.append(named_by(c))
        if c.exits:
            lines.append(f"    {c.function.function} skips its put at "
                         f"{', '.join(where(e) for e in exit_lines(c))}"
                         + (f" (released objects put it at {where(put_line(c))})"
                            if put_line(c) else ""))
        elif put_line(c) is not None:
            lines.append(f"    released objects put it at {where(put_line(c))}; "
                         "this one never got there")
        elif (last := last_use_line(c)) is not None:
            lines.append(f"    last used at {where(last[0])} (call to {last[1]}); "
                         "its put is missing after that")
        if c.expected:
            lines.append(f"    expected put: {short_path(c.expected, 8)}")
        lines.append(f"    unmatched in {c.objects} of {len(g.objects)} {word} objects "
                     f"({_plural(c.references, 'reference')}); the same path got "
                     f"{_plural(c.released_uses, 'reference')} in objects released correctly")
    lines += [f"    note: {note}" for note in (v.notes if v else ())]
    return lines


def named(c: Culprit) -> str:
    """`function (file.c:12)`: the culprit and, with DWARF, the line of the call in it
    that the reference came through (an extra get: the call that took it), or for a
    missing put the one line where its code skips the put."""
    exits = exit_lines(c)
    at = where(exits[0] if len(exits) == 1 else culprit_line(c))
    return f"{c.function.function or '??'}{f' ({at})' if at else ''}"


def named_by(c: Culprit) -> str:
    """Which evidence named the culprit, and by which rule: a user weighs a culprit
    named by good runs differently from one the history alone suggests."""
    rule = f" (rule {c.rule})" if c.rule else ""
    return f"    named by: {c.evidence}{rule}"


def render_held(g: LeakGroup, held: list[tuple[LeakGroup, int]]) -> list[str]:
    """A direct leak's group lists the leaked objects only it keeps alive."""
    if not held:
        return []
    text = ", ".join(f"'{h.type_name}' 0x{a:x}" for h, a in held[:MAX_LISTED_OBJECTS])
    more = f" and {len(held) - MAX_LISTED_OBJECTS} more" if len(held) > MAX_LISTED_OBJECTS else ""
    return [f"  Holds {_plural(len(held), 'leaked object')} (indirect leaks: fixing this "
            f"leak fixes them): {text}{more}"]


def render_history(obj: LeakedObject) -> list[str]:
    if not obj.history_total:
        return []
    kept = len(obj.history)
    dropped = obj.history_total - kept
    note = f", {dropped} later ones dropped (bound {kept} per object)" if dropped else ""
    lines = [f"    history: {kept} of {_plural(obj.history_total, 'operation')}{note}:"]
    for step in obj.history:
        cut = f" (stack {step.unwind.describe()})" if step.unwind.truncated_at is not None \
            else ""
        lines.append(f"      +{_age(step.at_ns):>9}  {step.op:<6} -> {step.count_after:<4} "
                     f"{short_path(step.frames)}{cut}")
    return lines


def summary_line(p: ProcessReport) -> str:
    if p.state == STATE_LIVE_AT_DETACH:
        return (f"SUMMARY: refcntd: {_plural(p.leaked_objects, 'object')} of "
                f"{_plural(p.leaked_types, 'type')} still live at detach in process {p.pid} "
                "(not counted as leaks)")
    misuse = sum(a.occurrences for a in p.misuse)
    extra = f", {_plural(misuse, 'anomaly')}" if misuse else ""
    if not p.groups:
        return f"SUMMARY: refcntd: no leaks{extra} in process {p.pid} ({p.comm})"
    kinds = _apart(p.groups)
    alive = "alive at exit" if kinds else "leaked"
    return (f"SUMMARY: refcntd: {_plural(p.leaked_objects, 'object')} of "
            f"{_plural(p.leaked_types, 'type')} {alive}{extra} in process {p.pid} ({p.comm})"
            + (f": {kinds}" if kinds else ""))


# leak kinds that LeakSanitizer does not call a leak (outputs/policy.py's REACHABLE, LATE)
NOT_LEAKS = ("still reachable", "created after the scan")


def _apart(groups: list[LeakGroup]) -> str:
    """`1 leaked, 3 still reachable`: what the objects alive at exit are, when the exit
    scan found some not leaked (else "", and they are all leaks)."""
    counts = {kind: sum(len(g.objects) for g in groups if g.kind == kind) for kind in NOT_LEAKS}
    if not any(counts.values()):
        return ""
    leaked = sum(len(g.objects) for g in groups) - sum(counts.values())
    return ", ".join([f"{leaked} leaked", *(f"{n} {k}" for k, n in counts.items() if n)])


def render_tracing(t: TracingStatus) -> str:
    lines = []
    failed = [p for p in t.probes if not p.installed]
    if t.complete:
        installed = _plural(sum(p.sites for p in t.probes), 'probe')
        cut = f", {_plural(t.stacks_cut, 'stack')} cut short (see the notes)" \
            if t.stacks_cut else ""
        idle = ", none fired (see the notes)" if t.probes and all(
            p.hits == 0 for p in t.probes) else ""
        lines.append(f"refcntd: tracing complete: {installed} installed{idle}, "
                     f"nothing lost{cut}")
    else:
        lines.append("refcntd: tracing INCOMPLETE, a clean result cannot be claimed:")
        lines += [f"  probe not installed: {p.role} {p.function} in {p.module}: {p.error}"
                  for p in failed]
        lines += [f"  {n} x {reason}" for reason, n in t.lost.items()]
    lines += [f"  note: {note}" for note in t.notes]
    return "\n".join(lines) + "\n"


QUIET_LISTED = 8  # processes named in the one line that says they had nothing


def quiet(p: ProcessReport) -> bool:
    """A process that exited with nothing to report (the `sh`, `dirname` and `id` of a
    `make check` script): not given a report of its own, only a name in quiet_summary."""
    return p.state == STATE_EXITED and not (p.groups or p.anomalies or p.kept or p.notes)


def quiet_summary(processes: list[ProcessReport]) -> str:
    """One SUMMARY line for every quiet process: a script's helpers are not a report
    each (the only process of a run keeps its own line)."""
    calm = [p for p in processes if quiet(p)]
    if len(calm) <= 1:
        return "".join(summary_line(p) + "\n" for p in calm)
    names = ", ".join(f"{p.comm} ({p.pid})" for p in calm[:QUIET_LISTED])
    more = f" and {len(calm) - QUIET_LISTED} more" if len(calm) > QUIET_LISTED else ""
    return visible(f"SUMMARY: refcntd: no leaks in {_plural(len(calm), 'process')}: "
                   f"{names}{more}") + "\n"


def render_run(result: RunResult) -> str:
    leaking = [p for p in result.processes if p.state != STATE_LIVE_AT_DETACH and p.groups]
    total = sum(p.leaked_objects for p in leaking)
    types = len({g.type_name for p in leaking for g in p.groups})
    text = quiet_summary(result.processes) + render_tracing(result.tracing)
    kinds = _apart([g for p in leaking for g in p.groups])
    text += (f"refcntd: {_plural(len(result.processes), 'process')} traced, "
             f"{_plural(total, 'object')} of {_plural(types, 'type')} "
             f"{'alive at exit' if kinds else 'leaked'} in "
             f"{_plural(len(leaking), 'process')}{f' ({kinds})' if kinds else ''}"
             f"{_live_note(result)}, {_plural(result.anomalies, 'anomaly')}\n")
    return visible(text, keep="\n")


def _live_note(result: RunResult) -> str:
    live = [p for p in result.processes if p.state == STATE_LIVE_AT_DETACH and p.groups]
    if not live:
        return ""
    return (f", {_plural(sum(p.leaked_objects for p in live), 'object')} still live at detach "
            f"in {_plural(len(live), 'process')} (not leaks)")
