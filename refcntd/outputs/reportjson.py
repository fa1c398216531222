"""A RunResult as versioned JSON (schema refcntd-report, outputs/jsontypes.py), written
in chunks so a million objects never sit in memory as one string; and the JSON of
serve's per-site views (GET /diff, GET /live)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import cast

from refcntd import __version__
from refcntd.analysis.culpritlines import culprit_line, exit_lines, last_use_line, put_line
from refcntd.analysis.model import (
    AnomalyFinding,
    LeakedObject,
    LeakGroup,
    Pointer,
    ProcessReport,
    ProcessSites,
    RunResult,
    SiteGroup,
    StackUnwind,
    TracingStatus,
)
from refcntd.analysis.pathops import Culprit, PathOp
from refcntd.inputs.outputfile import output_file
from refcntd.outputs.jsontypes import (
    AnomalyJson,
    CulpritJson,
    FrameJson,
    GroupJson,
    InstanceJson,
    OperationJson,
    PointerJson,
    ProbeJson,
    ProcessJson,
    RunJson,
    TracingJson,
    UnwindJson,
)
from refcntd.symbolize.symbolizer import Frame

JSON_SCHEMA = "refcntd-report"
JSON_VERSION = 1


def site_group_json(g: SiteGroup, since: bool) -> dict[str, object]:
    """`objects`: what the view counts (created since the checkpoint, with their mean
    age, or live)."""
    counted: dict[str, object] = {"objects": g.since, "mean_age_ns": g.since_mean_age_ns} \
        if since else {"objects": g.live}
    return {"type": g.type_name, **counted, "live": g.live, "created": g.created,
            "stack_truncated": g.stack_truncated, "unwind": unwind_json(g.unwind),
            "stack": [frame_json(f) for f in g.frames]}


def sites_json(p: ProcessSites, since: bool) -> dict[str, object]:
    return {"pid": p.pid, "comm": p.comm, "command": p.command,
            "groups": [site_group_json(g, since) for g in p.groups]}


def frame_json(f: Frame) -> FrameJson:
    out: FrameJson = {"module": f.module, "address": f"0x{f.vaddr:x}"}
    if f.function:
        out.update({"function": f.function, "offset": f.offset})
    if f.file:
        out.update({"file": f.file, "line": f.line})
    if not f.module:
        out["unresolved"] = f.raw
    if f.inlined:
        out["inlined"] = True
    return out


def group_json(g: LeakGroup, instances: bool = True) -> GroupJson:
    """Without `instances` the key is left out (stream_json writes them itself)."""
    out: GroupJson = {
        "type": g.type_name, "objects": len(g.objects), "stack_truncated": g.stack_truncated,
        "unwind": unwind_json(g.unwind),
        "stack": [frame_json(f) for f in g.frames],
        "culprits": [culprit_json(c) for c in g.culprits],
    }
    if instances:
        out["instances"] = [instance_json(o) for o in g.objects]
    if g.kind:
        out["kind"] = g.kind
    if g.class_name:
        out["class_name"] = g.class_name
    if g.verdict is not None:
        out["verdict"] = {"status": g.verdict.status, "reason": g.verdict.reason,
                          "notes": list(g.verdict.notes)}
        if g.verdict.candidates:
            out["verdict"]["candidates"] = list(g.verdict.candidates)
    return out


def culprit_json(c: Culprit) -> CulpritJson:
    out: CulpritJson = {
        "kind": c.kind, "function": c.function.function,
        "stack": [frame_json(f) for f in c.frames], "objects": c.objects,
        "references": c.references, "released_uses": c.released_uses,
        "expected_stack": [frame_json(f) for f in c.expected], "why": c.why,
        "tie": list(c.tie), "holder": c.holder, "rule": c.rule, "evidence": c.evidence}
    site, put = culprit_line(c), put_line(c)
    if site is not None:
        out.update({"file": site[0], "line": site[1]})
    if put is not None:
        out.update({"put_file": put[0], "put_line": put[1]})
    last = last_use_line(c)
    if last is not None:
        out.update({"last_use_file": last[0][0], "last_use_line": last[0][1],
                    "last_use_call": last[1]})
    if c.last_use:
        out["last_use_stack"] = [frame_json(f) for f in c.last_use]
    if c.exits:
        exits = exit_lines(c)
        if exits:
            out.update({"exit_file": exits[0][0], "exit_line": exits[0][1]})
        out["exits"] = [frame_json(f) for f in c.exits]
    if c.baseline:
        out["baseline"] = c.baseline
    return out


def unwind_json(u: StackUnwind) -> UnwindJson:
    """How the stack was obtained: {"method"} plus {"truncated_at", "reason"} when cut."""
    out: UnwindJson = {"method": u.method}
    if u.truncated_at is not None:
        out["truncated_at"] = u.truncated_at
        out["reason"] = u.reason
    return out


def pointer_json(p: Pointer) -> PointerJson:
    out: PointerJson = {"holder": p.holder, "slot": f"0x{p.slot:x}", "interior": p.interior,
                        "counted": p.counted}
    if p.why:
        out["why"] = p.why
    return out


def instance_json(o: LeakedObject) -> InstanceJson:
    out: InstanceJson = {"address": f"0x{o.address:x}", "count": o.count, "gets": o.gets,
                         "puts": o.puts, "age_ns": o.age_ns}
    if o.leak:
        out["leak"] = o.leak
        out["held_by"] = [{"address": f"0x{h.address:x}", "type": h.type_name,
                           "references": h.references, "stack": [frame_json(f) for f in h.frames]}
                          for h in o.held_by]
        out["cycle"] = [f"0x{a:x}" for a in o.cycle]
    if o.kind:
        out["kind"] = o.kind
    if o.root:
        out["root"] = o.root
    if o.holders >= 0:
        out["holders"], out["unheld"] = o.holders, o.unheld
        out["pointers"] = [pointer_json(p) for p in o.pointers]
    if o.history_total:
        out["history_total"] = o.history_total
        out["history_dropped"] = o.history_total - len(o.history)
        out["history"] = [{"op": s.op, "count_after": s.count_after, "at_ns": s.at_ns,
                           "stack": [frame_json(f) for f in s.frames],
                           "unwind": unwind_json(s.unwind)} for s in o.history]
    return out


def anomaly_json(a: AnomalyFinding) -> AnomalyJson:
    return {"kind": a.kind, "description": a.description, "type": a.type_name,
            "address": f"0x{a.address:x}", "count_before": a.count_before,
            "occurrences": a.occurrences, "separate": a.separate,
            "stack": [frame_json(f) for f in a.frames], "unwind": unwind_json(a.unwind),
            "alloc_stack": [frame_json(f) for f in a.alloc_frames],
            "alloc_unwind": unwind_json(a.alloc_unwind)}


def process_json(p: ProcessReport, instances: bool = True) -> ProcessJson:
    return {"pid": p.pid, "comm": p.comm, "command": p.command, "state": p.state,
            "exit_status": p.exit_status or None, "exit_code": p.exit_code,
            "direct_exit": p.direct_exit,
            "leaked_objects": p.leaked_objects, "leaked_types": p.leaked_types,
            "anomalies": [anomaly_json(a) for a in p.anomalies],
            "groups": [group_json(g, instances) for g in p.groups],
            "kept_by_library": dict(p.kept),
            "cycles": [[f"0x{a:x}" for a in c] for c in p.cycles], "notes": list(p.notes),
            "operations": [operation_json(t, op) for t, ops in sorted(p.operations.items())
                           for op in ops]}


OPERATION_FRAMES = 6  # the call made and a few callers: what a baseline compares


def operation_json(type_name: str, op: PathOp) -> OperationJson:
    return {"type": type_name, "op": op.op.name.lower(), "count": op.count,
            "stack": [frame_json(f) for f in op.frames[:OPERATION_FRAMES]]}


def tracing_json(t: TracingStatus) -> TracingJson:
    return {"complete": t.complete, "lost": dict(t.lost), "notes": list(t.notes),
            "probes": [cast(ProbeJson, vars(p)) for p in t.probes],
            "stacks_cut": t.stacks_cut}


def run_json(result: RunResult, instances: bool = True) -> RunJson:
    return {"schema": JSON_SCHEMA, "version": JSON_VERSION, "refcntd": __version__,
            "mode": result.mode, "spec": result.spec, "target": result.target,
            "command_status": result.command_status, "leak_kinds": result.leak_kinds,
            "tracing": tracing_json(result.tracing),
            "leaked_objects": result.leaked_objects, "anomalies": result.anomalies,
            "processes": [process_json(p, instances) for p in result.processes]}


def write_json(result: RunResult, path: str) -> None:
    """Through inputs/outputfile.py: a regular file is a new file renamed into place (a
    link planted at `path` by the traced command is replaced, never followed); `-`, a
    device, a FIFO or /dev/stdout are written in place."""
    with output_file(path) as f:
        for chunk in iter_json(result):
            f.write(chunk.encode())


def iter_json(result: RunResult, chunk_objects: int = 20000) -> Iterator[str]:
    """run_json(result) as text, streamed: each group's instances are formatted and written
    a chunk at a time, so a million leaked objects never exist as one document of dicts.
    The rest of the document is small (bounded by groups) and dumped as usual."""
    token = f"@@refcntd-instances-{uuid.uuid4().hex}-"
    groups = [g for p in result.processes for g in p.groups]
    doc = run_json(result, instances=False)
    marks = iter(range(len(groups)))
    for process in doc["processes"]:
        for group in process["groups"]:
            cast(dict[str, object], group)["instances"] = f"{token}{next(marks)}"
    text = json.dumps(doc, indent=2)
    pos = 0
    for match in re.finditer(f'"{re.escape(token)}(\\d+)"', text):
        yield text[pos:match.start()]
        yield from _instances_text(groups[int(match.group(1))].objects, chunk_objects)
        pos = match.end()
    yield text[pos:] + "\n"


def _instances_text(objects: Sequence[LeakedObject], chunk: int) -> Iterator[str]:
    yield "["
    for start in range(0, len(objects), chunk):
        if hasattr(objects, "json_lines"):  # drained as columns (analysis.leaks)
            lines = objects.json_lines(start, start + chunk)
        else:
            lines = [_instance_line(o) for o in objects[start:start + chunk]]
        yield ("," if start else "") + ",".join(lines)
    yield "]"


def _instance_line(o: LeakedObject) -> str:
    """instance_json(o) as JSON text; the common case (no history) without a dict."""
    if o.history_total or o.kind:
        return json.dumps(instance_json(o))
    return (f'{{"address": "0x{o.address:x}", "count": {o.count}, "gets": {o.gets}, '
            f'"puts": {o.puts}, "age_ns": {o.age_ns}}}')
