"""The binary analysis as a stage of check, attach and run (timed, with progress).

Apart from cli/common.py so that `check` does not import the tracing stages.
"""

from __future__ import annotations

from refcntd import progress
from refcntd.binary.hints import remember_probe_count
from refcntd.binary.plan import Plan, build_plan
from refcntd.inputs.spec import Spec


def analyse(spec: Spec, binary: str, modes: dict[str, str] | None = None,
            execs_later: bool = False) -> Plan:
    """The binary analysis, as a stage the user sees when it takes long."""
    with progress.stage("ELF/DWARF analysis"):
        plan = build_plan(spec, binary, modes, execs_later)
    remember_probe_count(binary, spec, len(plan.sites), bool(plan.cross))  # next time
    for module, cached in plan.dwarf_cached.items():
        progress.note(f"DWARF answers for {module}: "
                      + ("from the analysis cache" if cached else "computed"))
    return plan
