"""Probing a function at its call sites instead of its entry: the plan for one
function (every call and tail jump to it, in its module and the modules ld.so
loads with the program), and the sites in a module mapped later."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from refcntd.binary import callsites, probepoint, sitemode
from refcntd.binary.elf import ElfImage, Symbol
from refcntd.binary.libpaths import resolve_library
from refcntd.binary.probesite import (
    CrossModule,
    ProbeSite,
    call_site,
    entry_sites,
    function_locations,
)
from refcntd.inputs.spec import RoleSpec

if TYPE_CHECKING:
    from refcntd.binary.plan import Plan


def try_call_sites(plan: Plan, role: RoleSpec, image: ElfImage, module: str, sym: Symbol,
                   entry: probepoint.ProbePoint | probepoint.Refusal, why_prefix: str,
                   code: bytes) -> str | None:
    """Probe the call sites of `sym` instead of its entry; None when done, else why not."""
    requested = sitemode.mode_for(plan.probe_modes, role.role)
    cheap = isinstance(entry, probepoint.ProbePoint) and \
        entry.cost != probepoint.COST_SINGLE_STEP
    if requested == sitemode.MODE_ENTRY or (requested == sitemode.MODE_AUTO and cheap):
        return sitemode.decide(requested, entry, sitemode.CallSitePlan())[1]
    names = [f for r in plan.spec.entries for f in r.functions]  # one sweep for all
    targets, slots = sitemode.scan_targets(image, names, image.clones_of)
    followed = None if os.environ.get("REFCNTD_UNWIND") == "fp" else \
        (lambda: sitemode.load_set(plan.binary, image, resolve_library))
    calls = sitemode.plan_call_sites(image, sym, sitemode.module_scan(image, targets, slots),
                                     role.obj.at_return, role.role == "init", followed)
    mode, why = sitemode.decide(requested, entry, calls)
    if mode == sitemode.MODE_ENTRY:
        return why
    locations = function_locations(role)  # once, not per site: plans have thousands
    plan.sites += [call_site(role, sym, module, point, why_prefix, locations)
                   for point in calls.points]
    plan.decisions.append(sitemode.ModeDecision(role.role, sym.name, module,
                                                sitemode.MODE_CALLSITES, len(calls.points),
                                                calls.cost, why_prefix + why,
                                                vaddr=sym.vaddr))
    if calls.later:
        fallback = entry_sites(role, image, module, sym, code, entry,
                               why_prefix + "entry probe: back from call sites, " +
                               entry.reason)[0] if isinstance(entry, probepoint.ProbePoint) \
            else []
        plan.cross.append(CrossModule(role, sym.name, module, sym.vaddr, why_prefix,
                                      tuple(fallback)))
    return None


def importer_sites(cross: CrossModule, image: ElfImage) -> tuple[list[ProbeSite], list[str]]:
    """Call-site probes in `image`, a module mapped after tracing began, for the calls
    it makes to `cross` through its PLT; or why its calls cannot all be probed."""
    if not callsites.imports(image, cross.function):
        return [], []
    calls = sitemode.importer_plan(image, cross.function, cross.role.obj.at_return,
                                   cross.role.role == "init")
    return ([call_site(cross.role, cross, cross.module, point, cross.why_prefix)
             for point in calls.points], calls.blockers)
