"""REFCNTD_DUMP_EVIDENCE=FILE: the culprit inference's inputs, saved.

The inference (verdicts.judge_process) sees each leaked object's per-path
counts and what released objects of its type did; neither is in a run's
`--json`.  Appending them to FILE, one JSON line per reported process, lets
benchmarks/mutants re-judge a saved run with the current inference in
seconds, without rebuilding or tracing again (`mutants.py rescore`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from refcntd.analysis.model import LeakedObject, LeakGroup, LeakKey
from refcntd.analysis.pathops import PathOp
from refcntd.analysis.verdicts import Evidence
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame

ENV = "REFCNTD_DUMP_EVIDENCE"


def _op(op: PathOp) -> list[Any]:
    return [op.op.name, [dataclasses.astuple(f) for f in op.frames], op.count, op.first_ns,
            op.last_ns]


def _unop(row: list[Any]) -> PathOp:
    return PathOp(Role[row[0]], tuple(Frame(*f) for f in row[1]), row[2], row[3], row[4])


def dump(groups: list[LeakGroup], evidence: dict[LeakKey, list[Evidence]],
         released: dict[LeakKey, list[PathOp]]) -> None:
    """Append this process's inference inputs to $REFCNTD_DUMP_EVIDENCE, if set."""
    path = os.environ.get(ENV)
    if not path:
        return
    rows = []
    for group in groups:
        key = group.key()
        rows.append({"type": group.type_name,
                     "frames": [dataclasses.astuple(f) for f in group.frames],
                     "objects": [o.address for o in group.objects],
                     "evidence": [[e.address, e.type_name, e.init_ns, [_op(op) for op in e.ops],
                                   e.gap] for e in evidence.get(key, [])],
                     "released": [_op(op) for op in released.get(key, [])]})
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"groups": rows}) + "\n")


def load(path: Path) -> list[tuple[list[LeakGroup], dict[LeakKey, list[Evidence]],
                                   dict[LeakKey, list[PathOp]]]]:
    """The saved inputs, one entry per process, ready for verdicts.judge_process."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        groups, evidence, released = [], {}, {}
        for row in json.loads(line)["groups"]:
            group = LeakGroup(row["type"], tuple(Frame(*f) for f in row["frames"]),
                              [LeakedObject(a, 0, 0, 0, 0) for a in row["objects"]])
            groups.append(group)
            if row["evidence"]:
                evidence[group.key()] = [Evidence(a, t, ns, [_unop(op) for op in ops], gap)
                                         for a, t, ns, ops, gap in row["evidence"]]
                released[group.key()] = [_unop(op) for op in row["released"]]
        out.append((groups, evidence, released))
    return out
