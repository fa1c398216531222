"""refcntd's answer on one mutant, against the truth.

The new leak groups are those of the mutant's `--json` run that the
baseline run did not have (same type and allocation path) or had with fewer
objects.  Among the new groups of the mutated type, the one refcntd judged
on its own evidence (not "indirect"/"cycle") with the most objects is the
answer for the direct leak; for each other type that newly leaked (the
truth's indirect leaks), its largest new group.  Outcomes:

* right: a confident culprit (or an indirect group pointing at its holder's
  culprit) naming the mutated function;
* tie: "Culprit tie" with the mutated function among the candidates;
* unknown: "Culprit unknown", or an indirect/cycle verdict with no culprit;
* wrong: a confident culprit naming another function, or a tie without it;
* missed: no new group of that type.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("right", "tie", "unknown", "wrong", "missed")
STUBS = ("__refcnt__", "refcnt__delete")
PATH_FRAMES = 8
CLONE = re.compile(r"(\.(part|isra|constprop|cold|lto_priv|localalias)(\.\d+)?)+$")


def plain(function: str) -> str:
    """A symbol without gcc's clone suffix (foo.isra.0 is foo's code; foo.localalias is foo)."""
    return CLONE.sub("", function)


@dataclass(frozen=True)
class Group:
    type: str
    path: tuple[str, ...]  # allocation stack functions, stubs left out
    objects: int
    status: str
    culprits: tuple[str, ...]  # top culprit first
    tie: tuple[str, ...]
    kinds: tuple[str, ...]
    reason: str = ""

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.type, self.path)


def groups(run_json: Path) -> list[Group]:
    data = json.loads(run_json.read_text())
    out = []
    for proc in data["processes"]:
        for g in proc["groups"]:
            out.append(_group(g))
    return out


def _group(g: dict[str, Any]) -> Group:
    path = tuple(f.get("function") or f.get("unresolved", "?") for f in g["stack"]
                 if not (f.get("function") or "").startswith(STUBS))[:PATH_FRAMES]
    verdict = g.get("verdict") or {"status": "none"}
    cs = g.get("culprits", [])
    tie = tuple(cs[0].get("tie", [])) if cs else ()
    return Group(g["type"], path, g["objects"], verdict["status"],
                 tuple(plain(c["function"]) for c in cs), tuple(map(plain, tie)),
                 tuple(c["kind"] for c in cs), verdict.get("reason", "")[:160])


def new_groups(base: list[Group], mutant: list[Group]) -> list[Group]:
    had: dict[tuple[str, tuple[str, ...]], int] = {}
    for g in base:
        had[g.key] = had.get(g.key, 0) + g.objects
    out = []
    for g in mutant:
        left = had.get(g.key, 0)
        had[g.key] = max(0, left - g.objects)
        if g.objects > left:
            out.append(g)
    return out


def new_counts(base: list[Group], mutant: list[Group]) -> dict[str, int]:
    """refcntd's new leaked objects per type (the mutant run's minus the baseline's):
    what the truth's new_leaks counts, when both runs saw the same execution."""
    totals: dict[str, int] = {}
    for sign, groups in ((-1, base), (1, mutant)):
        for g in groups:
            totals[g.type] = totals.get(g.type, 0) + sign * g.objects
    return {t: n for t, n in sorted(totals.items()) if n > 0}


def answer(found: list[Group], kind: str) -> Group | None:
    """The group that answers for a leak of this type (see the module doc)."""
    of_type = [g for g in found if g.type == kind]
    if not of_type:
        return None
    own = [g for g in of_type if g.status not in ("indirect", "cycle")]
    return max(own or of_type, key=lambda g: g.objects)


def outcome(group: Group | None, function: str) -> str:
    if group is None:
        return "missed"
    if group.status == "tie":
        return "tie" if function in (group.tie or group.culprits) else "wrong"
    if not group.culprits:
        return "unknown"
    if group.status in ("culprit", "indirect", "cycle"):
        return "right" if group.culprits[0] == function else "wrong"
    return "unknown"


def said(group: Group | None) -> str:
    """What refcntd said, in a few words, for the per-mutant rows."""
    if group is None:
        return "no new group"
    names = ", ".join(group.tie or group.culprits[:1]) or group.reason or "-"
    kind = f"{group.kinds[0]} " if group.kinds and group.status == "culprit" else ""
    return f"{group.status}: {kind}{names} ({group.objects} {group.type})"


def signature(found: list[Group]) -> list[list[str]]:
    """The verdicts of a run, for comparing repeats."""
    return sorted([g.type, "/".join(g.path[:3]), str(g.objects), g.status, *g.culprits[:3]]
                  for g in found)


def from_model(g: Any) -> Group:
    """A Group from refcntd's report model (analysis.model.LeakGroup), as _group reads
    the same group from a run's --json: what `rescore` judges again."""
    path = tuple(f.function or f.raw or "?" for f in g.frames
                 if not f.function.startswith(STUBS))[:PATH_FRAMES]
    v = g.verdict
    cs = g.culprits
    tie = tuple(cs[0].tie) if cs else ()
    return Group(g.type_name, path, len(g.objects), v.status if v else "none",
                 tuple(plain(c.function.function) for c in cs), tuple(map(plain, tie)),
                 tuple(c.kind for c in cs), (v.reason if v else "")[:160])


LINE_OUTCOMES = ("right", "wrong", "no line")


def line_outcome(culprit: dict[str, Any] | None, mutated_file: str, mutated_line: int) -> str:
    """A "get added" mutant at line level: the top culprit of its group (a --json
    culprit, with `file`/`line` when refcntd named one) against the added get's line.
    The file compares by its trailing path parts (DWARF paths are absolute, the
    mutant's relative to its tree); "no line": no culprit, or none named (no DWARF)."""
    if not culprit or not culprit.get("line"):
        return "no line"
    tail = Path(mutated_file).parts
    same_file = Path(culprit["file"]).parts[-len(tail):] == tail
    return "right" if same_file and culprit["line"] == mutated_line else "wrong"
