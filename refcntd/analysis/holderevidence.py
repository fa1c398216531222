"""Culprits the holders decide (issue 55): which of several gets is the one nobody holds.

The counts cannot say which of an object's gets stayed without its put when several
pair off with its puts equally well (judging.Choice).  The scan can: each slot that
holds a reference is in something (`map 0x55.. .dso`: the `dso` member of a map), and
a reference held by an object of type T was taken by T's own code (map__init got the
dso reference its map holds).  A get on whose path a function of T's API runs is
explained by that holder, one get per holding slot; when every get left is one
function's, that function is where the reference nobody holds was dropped.  Perf 6.1's
kernel dso (issue 54): two gets, one in map__init, one in
machine__process_kernel_mmap_event; one holder, a map's .dso: the second is named.

Only objects the scan judged (holders known) are used; a choice it cannot settle is
left as the counts left it.  The rule is `holders-exclude`, measured like every other
(calibration.py).
"""

from __future__ import annotations

import dataclasses
import re

from refcntd.analysis.apinames import api_class, named_getter
from refcntd.analysis.attribution import FOUND, UNKNOWN
from refcntd.analysis.calibration import calibrate
from refcntd.analysis.judging import Choice, Verdict
from refcntd.analysis.model import LeakedObject, LeakGroup
from refcntd.analysis.ownership import CYCLE, INDIRECT
from refcntd.analysis.pathops import MISSING_PUT, Culprit, PathOp, frame_name, func_key
from refcntd.symbolize.symbolizer import Frame

RULE = "holders-exclude"
# `map 0x55d0.. .dso`, `GstBin 0x.. .children`: a holder that is a tracked object
_OBJECT_HOLDER = re.compile(r"^(?P<type>[A-Za-z_][\w]*) (?P<address>0x[0-9a-f]+)\b")
REFUTED = "holders-refute"


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def holder_types(obj: LeakedObject) -> list[str]:
    """The types of the tracked objects holding a reference to `obj` (one per slot)."""
    out = []
    for p in obj.pointers:
        m = _OBJECT_HOLDER.match(p.holder) if p.counted else None
        if m:
            out.append(_norm(m["type"]))
    return out


def _of_type(get: PathOp, kind: str) -> bool:
    """Whether a function of the type's API is on the get's path (its own code took it)."""
    return any(_norm(api_class(f)) == kind for f in get.path)


def _own_frame(get: PathOp, kind: str) -> str:
    return next((frame_name(f) for f, k in zip(get.frames, get.path, strict=True)
                 if _norm(api_class(k)) == kind), "?")


def settle(choice: Choice, obj: LeakedObject) -> tuple[Culprit, str] | None:
    """The one culprit the holders leave among the choice's gets, and the holder slots
    that explained the others; None when they do not single one out."""
    if obj.holders < 0 or obj.unheld < 1:
        return None
    left = list(choice.options)
    explained = []
    for kind in holder_types(obj):
        hit = next((o for o in left if _of_type(o[0], kind)), None)
        if hit is not None:
            left.remove(hit)
            explained.append((kind, hit[0]))
    named = [found for _, found in left]
    if not explained or not named or any(isinstance(f, str) or not f for f in named):
        return None
    functions = {frame_name(c.function) for f in named if not isinstance(f, str) for c in f}
    if len(functions) != 1:
        return None
    first = named[0]
    assert not isinstance(first, str)
    how = "; ".join(f"the get in {_own_frame(get, kind)} "
                    f"({' < '.join(frame_name(f) for f in get.frames[:3])}) is the one a "
                    f"{kind} holds" for kind, get in explained)
    return first[0], how


def decide(groups: list[LeakGroup]) -> None:
    """Groups the counts left undecided between gets, settled by the holders where they
    single out one function for every such object; then indirect verdicts the memory
    refutes (refute)."""
    refute(groups)
    for group in groups:
        v = group.verdict
        if v is None or v.status != UNKNOWN or not v.choices or \
                sum(c.references for c in v.choices) != v.unattributed:
            continue  # other references left unattributed for other reasons
        objects = {o.address: o for o in group.objects}
        settled = [settle(c, objects[c.address]) if c.address in objects else None
                   for c in v.choices]
        if any(s is None for s in settled):
            continue
        found = [s for s in settled if s is not None]
        if len({frame_name(c.function) for c, _ in found}) != 1:
            continue
        top, how = found[0]
        refs = sum(c.references for c in v.choices)
        unheld = sum(objects[c.address].unheld for c in v.choices)
        why = (f"{len(found)} object(s) had gets that pair off equally well; at the scan "
               f"{unheld} of their references were held by nothing, and {how}: the one left "
               f"is {frame_name(top.function)}'s")
        culprit = dataclasses.replace(top, rule=RULE, why=why, objects=len(found),
                                      references=refs,
                                      leaked_objects={c.address for c in v.choices})
        group.culprits = [culprit]
        group.verdict = Verdict(FOUND, why, [culprit], v.notes)
        calibrate([group])


def memory_holders(obj: LeakedObject) -> set[int]:
    """Addresses of the tracked objects whose memory holds a reference to `obj`."""
    return {int(m["address"], 16) for p in obj.pointers if p.counted
            and (m := _OBJECT_HOLDER.match(p.holder))}


def _keeper(frames: tuple[Frame, ...]) -> Frame | None:
    """The first function on a get's path whose name does not say it hands the
    reference up (dso__get, dsos__findnew do): the one that kept it."""
    return next((f for f in frames if f.function and not named_getter(func_key(f))), None)


def refute(groups: list[LeakGroup]) -> None:
    """History said a leaked object holds this one's reference (ownership.py guesses
    from paths and times); the scan saw that object's memory hold no pointer to it, and
    the reference held by nothing.  Such a group is no indirect leak: the function that
    kept the reference its history gave the holder is named (`holders-refute`)."""
    for group in groups:
        v = group.verdict
        if v is None or v.status not in (INDIRECT, CYCLE) or not group.objects:
            continue
        keepers: dict[str, tuple[Frame, tuple[Frame, ...]]] = {}
        for obj in group.objects:
            wrong = [h for h in obj.held_by if h.address not in memory_holders(obj)]
            if obj.holders < 0 or obj.unheld < 1 or not wrong:
                break
            for h in wrong:
                keeper = _keeper(h.frames)
                if keeper is None:
                    break
                keepers[frame_name(keeper)] = (keeper, h.frames)
        else:
            if len(keepers) != 1:
                continue
            (keeper, frames), = keepers.values()
            cut = frames[:frames.index(keeper) + 1]
            why = (f"its history gave the reference got at "
                   f"{' < '.join(frame_name(f) for f in cut)} to another leaked object, "
                   f"but at the scan that object held no pointer to it and "
                   f"{sum(o.unheld for o in group.objects)} reference(s) were held by "
                   f"nothing: {frame_name(keeper)} kept it and never put it")
            culprit = Culprit(MISSING_PUT, keeper, cut, len(group.objects),
                              sum(o.unheld for o in group.objects), rule=REFUTED, why=why,
                              leaked_objects={o.address for o in group.objects})
            group.culprits = [culprit]
            group.verdict = Verdict(FOUND, why, [culprit], v.notes)
            group.objects = [dataclasses.replace(o, leak="direct", held_by=()) for o in
                             group.objects]
            calibrate([group])
