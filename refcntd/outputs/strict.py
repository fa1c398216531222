"""`--strict`: for CI, a report that is less than exact and readable is a failure.

Without it, only lost records and missing probes make a run incomplete (24);
a stack that could not be resolved or was cut short, a type name that could
not be read, or a process whose exit was not seen still pass, because the
findings that were made are real.  A CI job that must trust a clean result
turns these into exit 24 too.
"""

from __future__ import annotations

from refcntd.analysis.model import STATE_EXIT_NOT_SEEN, RunResult

UNREAD_TYPE = "<type name at 0x"


def strict_problems(result: RunResult) -> list[str]:
    """What keeps the run from being exact and fully symbolized, one phrase each."""
    out = [] if result.tracing.complete else ["tracing incomplete"]
    probes = result.tracing.probes
    if not probes or all(p.hits == 0 for p in probes):  # (-1: not known, an older run)
        out.append("no probe fired")
    groups = [g for p in result.processes for g in p.groups]
    stacks = [g.frames for g in groups] + [a.frames for p in result.processes
                                          for a in p.anomalies]
    counts = {
        "unresolved frame(s)": sum(1 for s in stacks for f in s if not f.module),
        "truncated allocation stack(s)": sum(1 for g in groups if g.stack_truncated),
        "unreadable type name(s)": sum(1 for g in groups if g.type_name.startswith(UNREAD_TYPE)),
        "process(es) whose exit was not seen": sum(1 for p in result.processes
                                                   if p.state == STATE_EXIT_NOT_SEEN),
    }
    return out + [f"{n} {what}" for what, n in counts.items() if n]
