"""A run judged against good runs of the same workload (--baseline OLD.json).

analysis.regression compares one type's operations between two runs; this
matches each leaking process with the good runs' process of the same command,
names the culprit of the groups that grew there, and points the groups they
hold at it.  `run` judges each process as it exits, before its report is
printed, so the text says what the JSON and SARIF say.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from refcntd.analysis.attribution import FOUND, UNKNOWN
from refcntd.analysis.calibration import calibrate
from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import LeakGroup, LeakKey, ProcessReport, RunResult, owned_objects
from refcntd.analysis.ownership import CYCLE, INDIRECT
from refcntd.analysis.regression import Regression, consequence, regression


class Against:
    """Judges this run's new leaks against `olds`, runs of the same workload on the
    code before (`name`: how to refer to them), one process at a time in the order
    they exit: `run` prints each report judged.  Each process is compared with each
    old run's process of the same command; a group that leaks no more objects and
    references than the same group did there is not this change's and keeps its
    verdict.  `notes`: what kept the whole comparison from being made."""

    def __init__(self, olds: list[RunResult], name: str) -> None:
        self.name = name
        counted = [old for old in olds if any(p.operations for p in old.processes)]
        self.notes = [] if len(counted) == len(olds) else [
            f"{name}: {len(olds) - len(counted)} of {len(olds)} runs have no operation "
            "counts (a run without --history, or by an older refcntd): culprits are not "
            "compared with them"]
        # each old run's processes not matched yet
        self._left = [[p for p in old.processes if p.operations] for old in counted]

    def judge(self, proc: ProcessReport) -> list[str]:
        """Judge one process; what kept it from it, a line each."""
        if self.notes or not (proc.groups and proc.operations):
            return []
        befores = [b for left in self._left if (b := _take_match(left, proc)) is not None]
        if len(befores) < len(self._left):
            return [f"{self.name} has no process {' '.join(proc.command)[:80]!r} in every "
                    "run: its culprits are not compared"]
        _judge_against(proc, befores, self.name)
        return []


def against(result: RunResult, olds: list[RunResult], name: str) -> list[str]:
    """Every process of a finished run judged (Against); what kept it from it."""
    judge = Against(olds, name)
    return [*judge.notes, *(note for p in result.processes for note in judge.judge(p))]


# how a process is matched with an old run's: by command line, else executable, else
# executable name (the n-th `perf test` child with the n-th)
_SAME: list[Callable[[list[str]], object]] = [
    lambda c: c, lambda c: c[:1], lambda c: Path(c[0]).name if c else ""]


def _take_match(left: list[ProcessReport], proc: ProcessReport) -> ProcessReport | None:
    """The first of an old run's processes `left` that is the same as `proc`, taken
    from it; else, when one is left, that one (the build before may sit at another
    path)."""
    same = next((p for way in _SAME for p in left if way(p.command) == way(proc.command)),
                left[0] if len(left) == 1 else None)
    if same is not None:
        left.remove(same)
    return same


def _judge_against(proc: ProcessReport, befores: list[ProcessReport], name: str) -> None:
    had: dict[LeakKey, tuple[int, int]] = {}
    for before in befores:
        for g in before.groups:
            objects, refs = had.get(g.key(), (0, 0))
            had[g.key()] = (max(objects, len(g.objects)), max(refs, g.references()))
    found = {t: regression(t, [b.operations.get(t, []) for b in befores],
                           proc.operations.get(t, []), name)
             for t in sorted({g.type_name for g in proc.groups})}
    for type_name, reg in found.items():
        reg = consequence(reg, found)
        # a group held by leaked objects is their consequence, unless the comparison
        # shows its own type's references kept outside any teardown
        own = reg.culprit is not None and not reg.teardown
        for g in proc.groups:
            if g.type_name == type_name and _grew(g, had.get(g.key(), (0, 0))) and \
                    (own or not _held(g)):
                _apply(g, reg, name)
    calibrate(g for g in proc.groups if g.culprits and g.culprits[0].baseline)
    _point_to_holders(proc.groups)


def _grew(group: LeakGroup, had: tuple[int, int]) -> bool:
    return len(group.objects) > had[0] or group.references() > had[1]


def _held(group: LeakGroup) -> bool:
    """An indirect leak or a cycle: its holders' culprit is its culprit."""
    return group.verdict is not None and group.verdict.status in (INDIRECT, CYCLE)


def _point_to_holders(groups: list[LeakGroup]) -> None:
    """Indirect groups name the culprit their holders now have (verdicts.py did so
    with the run's own culprits); through holders that are indirect themselves."""
    by_address = {o.address: g for g in groups for o in owned_objects(g)}
    for _ in groups:  # a chain of holders is at most every group long
        changed = False
        for group in (g for g in groups if _held(g)):
            culprits = []
            for holder in sorted({(h.address, h.type_name) for o in owned_objects(group)
                                  for h in o.held_by}):
                owner = by_address.get(holder[0])
                if owner is None or owner is group or not owner.culprits \
                        or not owner.culprits[0].baseline:
                    continue
                culprits.append(dataclasses.replace(
                    owner.culprits[0], holder=f"{holder[1]} 0x{holder[0]:x}"))
            if culprits and [c.key() for c in culprits] != [c.key() for c in group.culprits]:
                group.culprits = culprits
                assert group.verdict is not None
                group.verdict = dataclasses.replace(group.verdict, culprits=culprits)
                changed = True
        if not changed:
            return


def _apply(group: LeakGroup, reg: Regression, name: str) -> None:
    old = group.verdict
    if reg.culprit is None:
        if old is None or reg.kept <= 0 or reg.reason in (old.reason, *old.notes):
            return
        if old.culprits and not old.culprits[0].baseline:
            # the comparison shows more than one function changed: the run's own culprit
            # (a guess among them, wrong in every such benchmark mutant) is not kept
            group.culprits = []
            group.verdict = Verdict(UNKNOWN, reg.reason, [], (f"without {name}: "
                                                                f"{_said(old)}",))
        else:
            group.verdict = dataclasses.replace(old, notes=(*old.notes, reg.reason))
        return
    culprit = dataclasses.replace(reg.culprit, objects=len(group.objects), baseline=name,
                                  leaked_objects={o.address for o in group.objects})
    if old is not None and old.culprits and old.culprits[0].baseline:
        notes = old.notes  # judged against a baseline already (a saved run rendered again)
    else:
        notes = (f"without {name}: {_said(old)}",)
    group.culprits = [culprit]
    group.verdict = Verdict(FOUND, "", [culprit], notes)


def _said(verdict: Verdict | None) -> str:
    """What the run alone said, in a line."""
    if verdict is None:
        return "no verdict"
    if verdict.culprits and verdict.status == FOUND:
        top = verdict.culprits[0]
        return f"{top.kind} in {top.function.function or '??'}"
    return f"{verdict.status}" + (f" ({verdict.reason})" if verdict.reason else "")
