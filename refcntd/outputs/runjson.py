"""Load a saved run (--json) back into the report model, so that every output
format renders a live run and a saved one the same way (`refcntd report`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import (
    AnomalyFinding,
    HistoryStep,
    Holder,
    LeakedObject,
    LeakGroup,
    Pointer,
    ProbeStatus,
    ProcessReport,
    RunResult,
    StackUnwind,
    TracingStatus,
)
from refcntd.analysis.pathops import Culprit, PathOp
from refcntd.errors import UsageError
from refcntd.inputs.files import REPORT_LIMIT, read_text
from refcntd.kernel.abi import Role
from refcntd.outputs.jsontypes import (
    AnomalyJson,
    CulpritJson,
    FrameJson,
    GroupJson,
    InstanceJson,
    OperationJson,
    ProcessJson,
    RunJson,
    UnwindJson,
)
from refcntd.outputs.reportjson import JSON_SCHEMA, JSON_VERSION
from refcntd.outputs.savedcolumns import CutRun
from refcntd.symbolize.symbolizer import INLINED, Frame

# a group's "instances" -> its objects when cut out as columns, else None (read per object)
Objects = Callable[[object], Sequence[LeakedObject] | None]


def load_run(path: str, what: str = "saved report") -> RunResult:
    """Plain instance arrays are read as columns (outputs/savedcolumns.py); when the cut
    text does not load the same way, the whole text is read again object by object,
    which also gives any error its line in the file as written."""
    text = read_text(path, what, REPORT_LIMIT)
    cut = CutRun(text)
    if cut.arrays:
        try:
            result = _parse(path, what, cut.skeleton, cut.objects)
            if cut.finish():
                return result
        except UsageError:
            pass
    return _parse(path, what, text, lambda _items: None)


def _parse(path: str, what: str, text: str, objects: Objects) -> RunResult:
    try:
        data = json.loads(text)
    except RecursionError:
        raise UsageError(f"{what} {path}: nested too deeply to be a refcntd report") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{path}:{err.lineno}: not JSON ({err.msg})") from None
    if not isinstance(data, dict) or data.get("schema") != JSON_SCHEMA:
        raise UsageError(f"{path}: not a refcntd report (schema is not {JSON_SCHEMA})")
    if data.get("version") != JSON_VERSION:
        raise UsageError(f"{path}: report version {data.get('version')} is not supported "
                         f"(this refcntd reads version {JSON_VERSION})")
    try:
        return _run(cast(RunJson, data), objects)  # a wrong shape raises below
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise UsageError(f"{path}: malformed refcntd report ({err!r})") from None


def run_from_json(d: RunJson) -> RunResult:
    """A run received as a JSON document (GET /leaks), objects and all."""
    return _run(d, lambda _items: None)


def _run(d: RunJson, objects: Objects) -> RunResult:
    tracing = TracingStatus([ProbeStatus(**p) for p in d["tracing"]["probes"]],
                            dict(d["tracing"]["lost"]), list(d["tracing"]["notes"]),
                            int(d["tracing"].get("stacks_cut", 0)))
    result = RunResult(d["mode"], d["spec"], d["target"],
                       [_process(p, objects) for p in d["processes"]],
                       tracing, d.get("command_status"))
    saved = d.get("leak_kinds")
    result.leak_kinds = _typed(saved, bool) if saved is not None else _judged_by_kinds(result)
    return result


def _judged_by_kinds(result: RunResult) -> bool:
    """A run saved before `leak_kinds` was written: LeakSanitizer's policy applied when
    its objects carry kinds, or a process was scanned, and no scan was missing."""
    from refcntd.session.exitscan import NOT_SCANNED
    notes = result.tracing.notes
    scanned = any(g.kind for p in result.processes for g in p.groups) or any(
        "scanned at exit for leak kinds" in n for n in notes)
    return result.mode == "run" and scanned and not any(n.startswith(NOT_SCANNED) for n in notes)


def _frame(f: FrameJson) -> Frame:
    """A saved frame, its fields of the types the analysis computes with (a saved run
    is a file anyone may have written: a wrong type is a malformed report)."""
    return Frame(_typed(f.get("module", ""), str), int(f.get("address", "0x0"), 16),
                 _typed(f.get("function", ""), str), _typed(f.get("offset", 0), int),
                 _typed(f.get("file", ""), str), _typed(f.get("line", 0), int),
                 INLINED if _typed(f.get("inlined", False), bool)
                 else _typed(f.get("unresolved", ""), str))


T = TypeVar("T")


def _typed(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{value!r:.40} is not {kind.__name__}")
    return value


def _frames(items: list[FrameJson]) -> tuple[Frame, ...]:
    return tuple(_frame(f) for f in items)


def _process(p: ProcessJson, objects: Objects) -> ProcessReport:
    return ProcessReport(p["pid"], p["comm"], list(p["command"]), p["state"],
                         p.get("exit_status") or "", p.get("exit_code"),
                         [_group(g, objects) for g in p["groups"]],
                         [_anomaly(a) for a in p.get("anomalies", [])],
                         dict(p.get("kept_by_library", {})),
                         notes=list(p.get("notes", [])),
                         operations=_operations(p.get("operations", [])),
                         direct_exit=p.get("direct_exit") is True)


def _operations(items: list[OperationJson]) -> dict[str, list[PathOp]]:
    out: dict[str, list[PathOp]] = {}
    for o in items:
        count = _typed(o["count"], int)
        if count < 0 or o["op"] not in ("init", "get", "put"):
            raise ValueError(f"operation {o['op']!r:.20} counted {count}")
        out.setdefault(_typed(o["type"], str), []).append(
            PathOp(Role[o["op"].upper()], _frames(o["stack"]), count))
    return out


def _culprit(c: CulpritJson) -> Culprit:
    frames = _frames(c["stack"])
    function = next((f for f in reversed(frames) if f.function == c["function"]),
                    Frame("", 0, c["function"], file=c.get("file", ""), line=c.get("line", 0)))
    return Culprit(c["kind"], function, frames, c["objects"], c["references"],
                   c["released_uses"], expected=_frames(c.get("expected_stack", [])),
                   why=c.get("why", ""), tie=tuple(c.get("tie", [])), holder=c.get("holder", ""),
                   last_use=_frames(c.get("last_use_stack", [])),
                   exits=_frames(c.get("exits", [])),
                   baseline=c.get("baseline", ""), rule=c.get("rule", ""))


def _group(g: GroupJson, objects: Objects) -> LeakGroup:
    culprits = [_culprit(c) for c in g.get("culprits", [])]
    v = g.get("verdict")
    verdict = Verdict(v["status"], v["reason"], culprits, tuple(v["notes"]),
                      tuple(v.get("candidates", []))) if v else None
    items = g.get("instances", [])
    cut = objects(items)
    return LeakGroup(g["type"], _frames(g["stack"]),
                     [_object(i) for i in items] if cut is None else cut,  # type: ignore[arg-type]
                     g.get("stack_truncated", False), culprits, _unwind(g.get("unwind")), verdict,
                     g.get("kind", ""), g.get("class_name", ""))


def _unwind(u: UnwindJson | None) -> StackUnwind:
    """None: a report written before stacks said how they were obtained."""
    if u is None:
        return StackUnwind()
    return StackUnwind(u["method"], u.get("truncated_at"), u.get("reason", ""))


def _object(i: InstanceJson) -> LeakedObject:
    history = tuple(HistoryStep(s["op"], s["count_after"], _frames(s["stack"]), s["at_ns"],
                                _unwind(s.get("unwind")))
                    for s in i.get("history", []))
    held = tuple(Holder(int(h["address"], 16), h["type"], h["references"], _frames(h["stack"]))
                 for h in i.get("held_by", []))
    return LeakedObject(int(i["address"], 16), i["count"], i["gets"], i["puts"], i["age_ns"],
                        history, i.get("history_total", 0), i.get("leak", ""), held,
                        tuple(int(a, 16) for a in i.get("cycle", [])), i.get("kind", ""),
                        i.get("root", ""), i.get("holders", -1),
                        tuple(Pointer(p["holder"], int(p["slot"], 16), p["interior"],
                                      p["counted"], p.get("why", ""))
                              for p in i.get("pointers", [])))


def _anomaly(a: AnomalyJson) -> AnomalyFinding:
    return AnomalyFinding(a["kind"], a["type"], int(a["address"], 16), a["count_before"],
                          _frames(a["stack"]), _frames(a["alloc_stack"]), a["occurrences"],
                          _unwind(a.get("unwind")), _unwind(a.get("alloc_unwind")))
