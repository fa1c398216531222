"""Objects a library keeps on purpose, by the spec's `kept_by_library` rules.

Libraries build tables and singletons they never free (GLib's type and quark
tables, GStreamer's static caps).  Like valgrind's default suppressions, a
bundled spec names them, so a clean program reports nothing; they are
counted, never hidden silently.  A rule names them by the first frame
(`created_in`), by a valgrind frame list (`stack`), or by a valgrind .supp
file's Memcheck:Leak entries (`valgrind`); matching: refcntd/inputs/suppressions.py.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from pathlib import Path

from refcntd.analysis.model import LeakGroup, ProcessReport
from refcntd.inputs.spec import KeptRule, KeptStack, Spec
from refcntd.inputs.suppressions import ANY, FrameLine
from refcntd.symbolize.symbolizer import Frame

SHOWN_ENTRIES = 6  # used entries named per report line


def stack_of(frames: tuple[Frame, ...]) -> list[tuple[str, str]]:
    """(function, module path) per frame, as the valgrind matcher reads them."""
    return [(f.function, f.module) for f in frames]


def matching_stack(rule: KeptRule, group: LeakGroup) -> KeptStack | None:
    """The rule's first stack pattern that matches the group's allocation stack."""
    if rule.type_name is not None and rule.type_name != group.type_name:
        return None
    stack = stack_of(group.frames)
    return next((s for s in rule.stacks if s.pattern.matches(stack)), None)


def matches(rule: KeptRule, group: LeakGroup) -> bool:
    """The rule's type, and its pattern on the first frame's module or function, or one
    of its stacks on the whole allocation stack."""
    if rule.stacks:
        return matching_stack(rule, group) is not None
    if rule.type_name is not None and rule.type_name != group.type_name:
        return False
    if not group.frames:
        return False
    first = group.frames[0]
    names = [Path(first.module).name if first.module else "", first.function]
    return any(fnmatch.fnmatchcase(n, pat) for pat in rule.created_in for n in names if n)


def set_aside(report: ProcessReport, rules: tuple[KeptRule, ...]) -> None:
    """Move the groups the library keeps out of the leaks, into report.kept: one line
    per rule; a rule with stacks also says which entries were used, and how many not."""
    if not rules:
        return
    leaks: list[LeakGroup] = []
    per_rule: dict[int, Counter[str]] = {}
    for group in report.groups:
        hit = _first_hit(rules, group)
        if hit is None:
            leaks.append(group)
            continue
        index, entry = hit
        per_rule.setdefault(index, Counter())[entry] += len(group.objects)  # entry: file:line
    report.groups = leaks
    for index, used in per_rule.items():
        label = _label(rules[index], used)
        report.kept[label] = report.kept.get(label, 0) + sum(used.values())


def _first_hit(rules: tuple[KeptRule, ...], group: LeakGroup) -> tuple[int, str] | None:
    for index, rule in enumerate(rules):
        if rule.stacks:
            stack = matching_stack(rule, group)
            if stack is not None:
                return index, stack.where
        elif matches(rule, group):
            return index, ""
    return None


def _label(rule: KeptRule, used: Counter[str]) -> str:
    """REASON (FILE: K of N entries used: NAME xOBJECTS ...; N-K unused) for a valgrind
    file; the reason alone for a rule's own `stack` or `created_in`."""
    if not rule.valgrind:
        return rule.reason
    name = {s.where: s.name for s in rule.stacks}
    ordered = sorted(used.items(), key=lambda kv: (-kv[1], name[kv[0]], kv[0]))
    names = [f"{name[where]} x{n}" for where, n in ordered[:SHOWN_ENTRIES]]
    more = len(used) - SHOWN_ENTRIES
    shown = ", ".join(names) + (f", and {more} more" if more > 0 else "")
    total = len(rule.stacks)
    return (f"{rule.reason} ({rule.source()}: {len(used)} of {total} entries used: {shown}; "
            f"{total - len(used)} unused)")


def describe(spec: Spec) -> list[str]:
    """What each kept_by_library rule holds on this machine, for `refcntd check`."""
    lines = []
    for rule in spec.kept_by_library:
        what = f"type {rule.type_name}" if rule.type_name else "any type"
        if rule.absent:
            lines.append(f"kept_by_library: {rule.valgrind} is absent (optional): keeps "
                         f"nothing here ({rule.reason})")
        elif rule.valgrind:
            lines.append(f"kept_by_library: {rule.valgrind}: {len(rule.stacks)} Memcheck:Leak "
                         f"entries ({rule.other_entries} for other tools or kinds, unused), "
                         f"{what}: {rule.reason}")
            lines += _everything(rule)
        elif rule.stacks:
            frames = " ".join(map(str, rule.stacks[0].pattern.lines))
            lines.append(f"kept_by_library: stack {frames}, {what}: {rule.reason}")
        else:
            lines.append(f"kept_by_library: created in {', '.join(rule.created_in)}, {what}: "
                         f"{rule.reason}")
    return lines


def _everything(rule: KeptRule) -> list[str]:
    """Entries with nothing left after their allocator frames: they keep every object."""
    return [f"  entry {s.name} ({s.where}) has only allocator frames: it keeps every "
            f"object{' of type ' + rule.type_name if rule.type_name else ''}"
            for s in rule.stacks if s.pattern.lines == (FrameLine(ANY),)]
