"""gcc's copies of a probed function (.isra, .constprop, .part): the role with its
argument registers as the copy receives them, read from DWARF."""

from __future__ import annotations

from dataclasses import replace

from refcntd.binary.analysiscache import DwarfFacts
from refcntd.binary.elf import Symbol
from refcntd.inputs.spec import ExistingReturn, RoleSpec, Source


def remap_for_clone(role: RoleSpec, facts: DwarfFacts, clone: Symbol, fname: str
                    ) -> RoleSpec | str:
    """The role with argument indexes as the clone receives them, or why not."""
    if not facts.image.has_debug_info:
        return "without DWARF its argument layout is unknown"
    regs = facts.clone_registers(clone.vaddr, fname)
    if regs is None:
        return "its DWARF does not describe it"

    def move(src: Source | None, what: str) -> Source | None:
        if src is None or not src.arg:
            return src
        if src.arg not in regs:
            raise LookupError(f"its {what} (argument {src.arg}) was optimized away")
        return replace(src, arg=regs[src.arg])

    try:
        return replace(role, obj=move(role.obj, "object"),  # type: ignore[arg-type]
                       type_name=_type_or_unknown(role.type_name, regs),
                       initial_count=move(role.initial_count, "initial count"),
                       may_return_existing=_move_reused(role, regs))
    except LookupError as err:
        return str(err)


def _type_or_unknown(src: Source | None, regs: dict[int, int]) -> Source | None:
    """A clone that dropped the type-name argument still counts, under a placeholder type."""
    if src is None or not src.arg:
        return src
    if src.arg in regs:
        return replace(src, arg=regs[src.arg])
    return Source(constant="<type not passed to clone>")


def _move_reused(role: RoleSpec, regs: dict[int, int]) -> ExistingReturn | None:
    """The argument of the object a constructor may reuse, as the clone receives it."""
    existing = role.may_return_existing
    if existing is None or not existing.reused_arg:
        return existing
    if existing.reused_arg not in regs:
        raise LookupError(f"its reused object (argument {existing.reused_arg}) was "
                          "optimized away")
    return replace(existing, reused_arg=regs[existing.reused_arg])
