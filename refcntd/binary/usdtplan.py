"""USDT (SDT) probes: one probe per site of the spec's probe, its arguments read
where the SDT note says, its semaphore raised by the kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from refcntd.binary import probepoint, sdt
from refcntd.binary.elf import ElfImage
from refcntd.binary.probesite import ArgLocations, ProbeSite
from refcntd.binary.sdt import ArgLoc
from refcntd.inputs.spec import RoleSpec

if TYPE_CHECKING:
    from refcntd.binary.plan import Plan


def plan_usdt(plan: Plan, role: RoleSpec, image: ElfImage, module: str) -> None:
    """One probe per site of the USDT probe; the kernel owns its semaphore."""
    probes = [p for p in sdt.sdt_probes(image) if p.full_name == role.usdt]
    if not probes:
        names = sorted({p.full_name for p in sdt.sdt_probes(image)})
        listed = f" (it has: {', '.join(names[:12])})" if names else " (it has no SDT probes)"
        plan.problems.append(f"{role.role}: no USDT probe {role.usdt} in {module}{listed}")
        return
    for probe in probes:
        why = _plan_usdt_site(plan, role, image, module, probe)
        if why:
            plan.problems.append(f"{role.role}: USDT probe {role.usdt} at 0x{probe.pc:x} in "
                                 f"{module}: {why}")


def _plan_usdt_site(plan: Plan, role: RoleSpec, image: ElfImage, module: str,
                    probe: sdt.SdtProbe) -> str | None:
    if probe.arg_text and not probe.args:
        return f"cannot decode its argument specs '{probe.arg_text}'"
    locs: dict[str, ArgLoc | None] = {}
    for key, src in (("obj_loc", role.obj), ("type_loc", role.type_name),
                     ("count_loc", role.initial_count)):
        if src is not None and src.arg:
            if src.arg > len(probe.args):
                return f"has {len(probe.args)} arguments, the spec reads argument {src.arg}"
            locs[key] = probe.args[src.arg - 1]
    file_offset = image.vaddr_to_offset(probe.pc)
    insn = probepoint.first_instruction(image.code_at(probe.pc, 16))
    if file_offset is None or insn is None:
        return "its location is not in the file"
    refused = probepoint.refused_reason(insn)
    if refused:
        return f"the kernel cannot probe its instruction ({refused})"
    sema = sdt.semaphore_file_offset(image, probe)
    gate = f"semaphore at 0x{probe.semaphore:x} (file offset 0x{sema:x}), raised by the kernel" \
        if sema else "no semaphore"
    plan.sites.append(ProbeSite(
        role.role, f"usdt {probe.full_name}", module, probe.pc, 0, file_offset,
        probepoint.cost_of(insn), f"USDT probe site ({insn.mnemonic}); {gate}", -1, False,
        role, ref_ctr_offset=sema, **cast(ArgLocations, locs)))
    return None
