"""What the planner produces: a ProbeSite (where one probe goes and where it reads
the role's values), the constructors of entry-probe and call-site ProbeSites, and
CrossModule (an exported function probed at its call sites)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NotRequired, TypedDict

from refcntd.binary import probepoint, sdt, sitemode
from refcntd.binary.elf import ElfImage, Symbol
from refcntd.binary.sdt import ArgLoc
from refcntd.inputs.spec import RoleSpec, Source


@dataclass(frozen=True)
class ProbeSite:
    role: str
    function: str  # symbol name actually probed (may be a clone)
    module: str  # absolute path of the ELF file
    symbol_vaddr: int
    probe_offset: int  # from the symbol's start
    file_offset: int  # what the kernel's uprobe wants
    cost: str
    reason: str
    caller_sp_offset: int
    is_return: bool
    spec_role: RoleSpec
    obj_loc: ArgLoc
    type_loc: ArgLoc | None = None  # None: the spec's constant type name
    count_loc: ArgLoc | None = None  # None: the spec's constant initial count
    ref_ctr_offset: int = 0  # USDT semaphore, as a file offset
    mode: str = sitemode.MODE_ENTRY  # or MODE_CALLSITES: probe_offset is then the site's
    site_kind: str = ""  # call-site probes: "call", "jmp", "return" (after a call), "save"
    site_length: int = 0  # of the call instruction
    site_cond: int = 0  # a conditional tail jump: 0x10 | x86 condition code (BPF tests it)
    callee_module: str = ""  # a call site in another module (a PLT caller): the function's

    @property
    def uretprobe(self) -> bool:
        """Call-site return probes are plain uprobes on the instruction after the call."""
        return self.is_return and self.mode == sitemode.MODE_ENTRY


class ArgLocations(TypedDict):
    """The ProbeSite fields that say where a probe reads the role's values."""

    obj_loc: ArgLoc
    type_loc: NotRequired[ArgLoc | None]
    count_loc: NotRequired[ArgLoc | None]


def function_locations(role: RoleSpec) -> ArgLocations:
    """Where a function probe finds the role's values: argument registers, or rax."""
    def loc(src: Source | None) -> ArgLoc | None:
        return sdt.register_arg(src.arg) if src is not None and src.arg else None
    obj = sdt.RETURN_VALUE if role.obj.is_return else loc(role.obj)
    assert obj is not None  # a spec's `object` is an argument or the return value
    return {"obj_loc": obj, "type_loc": loc(role.type_name),
            "count_loc": loc(role.initial_count)}


def saver_locations(role: RoleSpec, locations: ArgLocations | None = None) -> ArgLocations:
    """Where a constructor's argument saver reads: as its return probe, but the object
    location is the argument whose object it may reuse (may_return_existing: {reuses})."""
    locs = locations or function_locations(role)
    reused = role.may_return_existing.reused_arg if role.may_return_existing else 0
    if reused and not role.obj.out:
        return {**locs, "obj_loc": sdt.register_arg(reused)}
    return locs


def needed_args(role: RoleSpec) -> set[int]:
    """Argument registers a probe must read (a return probe's object is the return value;
    its argument saver reads the argument of an object it may reuse)."""
    sources = [role.obj, role.type_name, role.initial_count]
    reused = role.may_return_existing.reused_arg if role.may_return_existing else 0
    return {s.arg for s in sources if s is not None and s.arg} | ({reused} if reused else set())


@dataclass(frozen=True)
class CrossModule:
    """An exported function probed at its call sites: modules mapped later must be
    scanned for calls to it before they run (session/vetting.py), and where one
    cannot be, the function goes back to `fallback`, its entry probe."""

    role: RoleSpec
    function: str
    module: str  # where it is defined
    symbol_vaddr: int
    why_prefix: str
    fallback: tuple[ProbeSite, ...]  # empty: its entry cannot be probed either


def entry_sites(role: RoleSpec, image: ElfImage, module: str, sym: Symbol, code: bytes,
                choice: probepoint.ProbePoint, reason: str
                ) -> tuple[list[ProbeSite], str | None]:
    """The entry probe of `sym` (and a constructor's argument saver), or a problem."""
    file_offset = image.vaddr_to_offset(sym.vaddr + choice.offset)
    if file_offset is None:
        return [], f"{role.role}: {sym.name} in {module}: address outside the file"
    caller_sp = -1 if role.obj.at_return else choice.caller_sp_offset
    sites = [ProbeSite(role.role, sym.name, module, sym.vaddr, choice.offset, file_offset,
                       choice.cost, reason, caller_sp, role.obj.at_return, role,
                       **function_locations(role))]
    if role.obj.at_return and role.role == "init":  # also marks the thread as constructing
        saver = _argument_saver(role, image, module, sym, code)
        if isinstance(saver, str):
            return sites, saver
        sites.append(saver)
    return sites, None


def call_site(role: RoleSpec, sym: Symbol | CrossModule, module: str,
              point: sitemode.SitePoint, why_prefix: str,
              locations: ArgLocations | None = None) -> ProbeSite:
    """One call-site probe of `sym` (defined in `module`), possibly in another module."""
    is_saver = point.kind == "save"
    name, vaddr = (sym.function, sym.symbol_vaddr) if isinstance(sym, CrossModule) \
        else (sym.name, sym.vaddr)
    return ProbeSite(
        "init_entry" if is_saver else role.role, name, point.module or module, vaddr,
        point.vaddr - vaddr, point.file_offset, point.cost,
        f"{why_prefix}{point.kind} site in {point.caller or '?'}", point.caller_sp,
        point.kind == "return", role,
        **(saver_locations(role, locations) if is_saver else
           locations or function_locations(role)),
        mode=sitemode.MODE_CALLSITES, site_kind=point.kind, site_length=point.length,
        site_cond=point.cond, callee_module=module if point.module else "")


def _argument_saver(role: RoleSpec, image: ElfImage, module: str, sym: Symbol, code: bytes
                    ) -> ProbeSite | str:
    """A constructor's entry probe: saves its type/count/out-pointer arguments, and
    marks the thread as inside a constructor, so references its instance init
    takes on the object before it returns are added to the object's count."""
    choice = probepoint.choose(code, needed_args(role))
    if isinstance(choice, probepoint.Refusal):
        return (f"{role.role}: {sym.name} in {module}: its arguments cannot be "
                f"saved at entry: {choice.reason}")
    file_offset = image.vaddr_to_offset(sym.vaddr + choice.offset)
    if file_offset is None:
        return f"{role.role}: {sym.name} in {module}: address outside the file"
    return ProbeSite("init_entry", sym.name, module, sym.vaddr, choice.offset,
                     file_offset, choice.cost,
                     "saves the arguments the return probe needs; " + choice.reason, -1,
                     False, role, **saver_locations(role))
