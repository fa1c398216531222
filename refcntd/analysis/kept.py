"""Objects a library keeps on purpose, by the spec's `kept_by_library` rules.

Libraries build tables and singletons they never free (GLib's type and quark
tables, GStreamer's static caps).  Like valgrind's default suppressions, a
bundled spec names them, so a clean program reports nothing; they are
counted, never hidden silently.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from refcntd.analysis.model import LeakGroup, ProcessReport
from refcntd.inputs.spec import KeptRule


def matches(rule: KeptRule, group: LeakGroup) -> bool:
    """The rule's type, and its pattern on the first frame's module or function."""
    if rule.type_name is not None and rule.type_name != group.type_name:
        return False
    if not group.frames:
        return False
    first = group.frames[0]
    names = [Path(first.module).name if first.module else "", first.function]
    return any(fnmatch.fnmatchcase(n, pat) for pat in rule.created_in for n in names if n)


def set_aside(report: ProcessReport, rules: tuple[KeptRule, ...]) -> None:
    """Move the groups the library keeps out of the leaks, into report.kept."""
    if not rules:
        return
    leaks: list[LeakGroup] = []
    for group in report.groups:
        rule = next((r for r in rules if matches(r, group)), None)
        if rule is None:
            leaks.append(group)
        else:
            report.kept[rule.reason] = report.kept.get(rule.reason, 0) + len(group.objects)
    report.groups = leaks
