"""Binary analysis: turn a spec and a binary into the list of probes to place.

Pure file analysis (no root, no bcc) so `refcntd check` and the unit tests
run anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from refcntd.binary import callsites, dwarfinfo, probepoint, sdt, sitemode, specchecks
from refcntd.binary.analysiscache import DwarfFacts
from refcntd.binary.elf import CLONE_RE, ElfImage, Symbol
from refcntd.binary.sdt import ArgLoc
from refcntd.errors import BinaryError, ProbeError
from refcntd.inputs.spec import RoleSpec, Source, Spec
from refcntd.paths import CACHE_DIR

FP_SAMPLE = 400


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


@dataclass
class ModuleInfo:
    path: str
    build_id: str | None
    has_symtab: bool

    @property
    def frame_pointers(self) -> str:
        """Computed when shown (check): it disassembles hundreds of functions."""
        return frame_pointer_summary(ElfImage(self.path))


@dataclass(frozen=True)
class LdsoProbe:
    """Where ld.so calls _dl_debug_state(): the BPF side learns each loaded
    library's path there.  The call sites, not the function: its body is a
    `ret` the kernel would single-step, a `call` it emulates."""

    path: str
    sites: tuple[tuple[int, int], ...]  # (file offset, _r_debug minus the site's address)


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


@dataclass
class Plan:
    spec: Spec
    sites: list[ProbeSite] = field(default_factory=list)
    ldso: LdsoProbe | None = None
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    usdt: dict[str, list[sdt.SdtProbe]] = field(default_factory=dict)  # module -> its SDT probes
    problems: list[str] = field(default_factory=list)  # a required probe cannot be placed
    notes: list[str] = field(default_factory=list)  # worth knowing, not fatal
    probe_modes: dict[str, str] = field(default_factory=lambda: {"*": sitemode.MODE_AUTO})
    binary: str = ""  # the traced executable or library
    decisions: list[sitemode.ModeDecision] = field(default_factory=list)  # per function
    # DWARF the scan could not examine (tracing incomplete): reason -> units not examined
    scan_gaps: dict[str, int] = field(default_factory=dict)
    dwarf_cached: dict[str, bool] = field(default_factory=dict)  # module -> answers from cache
    cross: list[CrossModule] = field(default_factory=list)  # exported, in call-site mode

    def require_complete(self) -> None:
        if self.problems:
            raise ProbeError(self.problems[0], "run `refcntd check` for the full analysis")


def needed_args(role: RoleSpec) -> set[int]:
    """Argument registers a probe must read (a return probe's object is the return value)."""
    sources = [role.obj, role.type_name, role.initial_count]
    return {s.arg for s in sources if s is not None and s.arg}


def frame_pointer_summary(image: ElfImage) -> str:
    """Share of non-leaf functions that set up %rbp: stacks are only as deep as this allows."""
    syms = [s for group in image.symbols.values() for s in group if s.size][:FP_SAMPLE]
    framed = non_leaf = 0
    for sym in syms:
        has_frame, calls = probepoint.frame_setup(image.code_at(sym.vaddr, min(sym.size, 4096)))
        non_leaf += calls
        framed += has_frame and calls
    if not non_leaf:
        return "unknown (no non-leaf function symbols)"
    share = 100 * framed // non_leaf
    verdict = "yes" if share >= 80 else ("partly" if share >= 20 else "no")
    return f"{verdict} ({framed} of {non_leaf} non-leaf functions set up %rbp)"


def resolve_library(name: str, exe: ElfImage | None) -> str:
    """A spec's `library:` as a path: absolute, or a soname found the way ld.so would."""
    if "/" in name:
        if not Path(name).exists():
            raise BinaryError(f"library {name} (named in the spec) does not exist")
        return str(Path(name).resolve())
    for directory in _library_dirs(exe):
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate.resolve())
    raise BinaryError(f"library {name} (named in the spec) not found",
                      "give its path in the spec, or set LD_LIBRARY_PATH")


def _library_dirs(exe: ElfImage | None) -> list[str]:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if exe is not None:
        origin = str(exe.path.resolve().parent)
        dirs += [d.replace("$ORIGIN", origin) for d in exe.runpaths()]
    dirs += _ldconfig_dirs() + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                                "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]
    return dirs


def _ldconfig_dirs() -> list[str]:
    """The directories of ld.so's cache, read once per version of /etc/ld.so.cache (a
    program's load set resolves dozens of sonames; `ldconfig -p` is a process each)."""
    try:
        stamp = os.stat(LD_SO_CACHE).st_mtime_ns
    except OSError:
        stamp = 0
    dirs = _LDCONFIG.get(stamp)
    if dirs is None:  # (a local: serve's threads may plan at once)
        dirs = _run_ldconfig()
        _LDCONFIG.clear()
        _LDCONFIG[stamp] = dirs
    return list(dirs)


LD_SO_CACHE = "/etc/ld.so.cache"
_LDCONFIG: dict[int, list[str]] = {}  # the cache's mtime -> its directories


def _run_ldconfig() -> list[str]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({str(Path(line.rsplit("=> ", 1)[1]).parent) for line in out.splitlines()
                   if "=> " in line})


def build_plan(spec: Spec, binary: str, probe_modes: dict[str, str] | None = None) -> Plan:
    """Analyse `binary` (and the libraries the spec names) for every role of `spec`."""
    plan = Plan(spec, binary=binary)
    if probe_modes:
        plan.probe_modes = probe_modes
    main = ElfImage(binary)
    images: dict[str, ElfImage] = {str(main.path.resolve()): main}
    facts: dict[str, DwarfFacts] = {}
    try:
        for role in spec.entries:
            module = str(main.path.resolve())
            if role.library:
                module = resolve_library(role.library, main)
                if module not in images:
                    images[module] = ElfImage(module)
            if role.usdt:
                _plan_usdt(plan, role, images[module], module)
            else:
                if module not in facts:
                    facts[module] = DwarfFacts(images[module], spec)
                    facts[module].start_scan()
                _plan_role(plan, role, facts[module], module)
    finally:
        for f in facts.values():
            f.finish()
    for f in facts.values():
        f.save()
    plan.dwarf_cached = {m: f.loaded for m, f in facts.items()}
    libraries: dict[str, str | None] = {
        role.library or "": (resolve_library(role.library, main) if role.library
                             else str(main.path.resolve())) for role in spec.entries}
    plan.problems += specchecks.double_counts(spec, libraries, images)
    plan.ldso = find_ldso_probe(main)
    if plan.ldso is None:
        plan.notes.append("no ld.so probe: frames in libraries unloaded before exit are "
                          "resolved only if the library sits next to a known module")
    for path, image in images.items():
        plan.usdt[path] = sdt.sdt_probes(image)
        plan.modules[path] = ModuleInfo(path, image.build_id, image.has_symtab)
        if image.build_id is None:
            plan.notes.append(f"{path} has no build-id: stacks through it are resolved only "
                              "while the process lives")
    return plan


def _plan_role(plan: Plan, role: RoleSpec, facts: DwarfFacts, module: str) -> None:
    image = facts.image
    found_any = False
    for fname in role.functions:
        syms = image.symbols.get(fname, [])
        for sym in syms:
            _plan_symbol(plan, role, image, module, sym)
        clones = _plan_clones(plan, role, facts, module, fname)
        found_any = found_any or bool(syms) or clones
    scan = facts.inlined_copies(set(role.functions))
    _note_scan_gaps(plan, role, module, scan)
    inlined = scan.copies
    for copy in inlined:
        plan.problems.append(
            f"{role.role}: {copy.function} was inlined at {copy.count} call site(s) in {module} "
            f"({', '.join(copy.sites)}): those calls cannot be probed and counts would be wrong; "
            f"mark it __attribute__((noinline))")
    if not found_any and not inlined:
        names = ", ".join(role.functions)
        where = module if image.has_symtab else f"{module} (stripped: no .symtab)"
        plan.problems.append(f"{role.role}: no function {names} in {where}")


def _note_scan_gaps(plan: Plan, role: RoleSpec, module: str, scan: dwarfinfo.InlinedScan
                    ) -> None:
    """Units the inlined-copy scan did not reach make tracing incomplete, said by name."""
    if scan.complete:
        return
    shown = ", ".join(scan.not_examined[:5]) + (", ..." if len(scan.not_examined) > 5 else "")
    why = (f"compilation units of {module} not examined for inlined copies of "
           f"{', '.join(role.functions)} ({shown}): calls inlined there would not be counted")
    plan.scan_gaps[why] = len(scan.not_examined)


def _plan_symbol(plan: Plan, role: RoleSpec, image: ElfImage, module: str, sym: Symbol,
                 why_prefix: str = "") -> None:
    code = image.code_at(sym.vaddr, sym.size or 64)
    # A return probe reads only the return value; its arguments are saved at entry.
    args = set() if role.obj.at_return else needed_args(role)
    choice = probepoint.choose(code, args, needs_entry_sp=role.obj.at_return)
    why_entry = _plan_call_sites(plan, role, image, module, sym, choice, why_prefix, code)
    if why_entry is None:
        return
    if isinstance(choice, probepoint.Refusal):
        plan.problems.append(f"{role.role}: {sym.name} in {module}: {choice.reason}; "
                             f"{why_entry}")
        return
    plan.decisions.append(sitemode.ModeDecision(role.role, sym.name, module,
                                                sitemode.MODE_ENTRY, 1, choice.cost,
                                                why_entry, vaddr=sym.vaddr))
    kept = f"; {why_entry}" if why_entry.startswith("entry probe kept") else ""
    sites, problem = _entry_sites(role, image, module, sym, code, choice,
                                  why_prefix + choice.reason + kept)
    plan.sites += sites
    if problem:
        plan.problems.append(problem)


def _entry_sites(role: RoleSpec, image: ElfImage, module: str, sym: Symbol, code: bytes,
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


def _plan_call_sites(plan: Plan, role: RoleSpec, image: ElfImage, module: str, sym: Symbol,
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
    plan.sites += [_call_site(role, sym, module, point, why_prefix, locations)
                   for point in calls.points]
    plan.decisions.append(sitemode.ModeDecision(role.role, sym.name, module,
                                                sitemode.MODE_CALLSITES, len(calls.points),
                                                calls.cost, why_prefix + why,
                                                vaddr=sym.vaddr))
    if calls.later:
        fallback = _entry_sites(role, image, module, sym, code, entry,
                                why_prefix + "entry probe: back from call sites, " +
                                entry.reason)[0] if isinstance(entry, probepoint.ProbePoint) \
            else []
        plan.cross.append(CrossModule(role, sym.name, module, sym.vaddr, why_prefix,
                                      tuple(fallback)))
    return None


def _call_site(role: RoleSpec, sym: Symbol | CrossModule, module: str,
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
        point.kind == "return", role, **(locations or function_locations(role)),
        mode=sitemode.MODE_CALLSITES, site_kind=point.kind, site_length=point.length,
        site_cond=point.cond, callee_module=module if point.module else "")


def importer_sites(cross: CrossModule, image: ElfImage) -> tuple[list[ProbeSite], list[str]]:
    """Call-site probes in `image`, a module mapped after tracing began, for the calls
    it makes to `cross` through its PLT; or why its calls cannot all be probed."""
    if not callsites.imports(image, cross.function):
        return [], []
    calls = sitemode.importer_plan(image, cross.function, cross.role.obj.at_return,
                                   cross.role.role == "init")
    return ([_call_site(cross.role, cross, cross.module, point, cross.why_prefix)
             for point in calls.points], calls.blockers)


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
                     False, role, **function_locations(role))


def _plan_clones(plan: Plan, role: RoleSpec, facts: DwarfFacts, module: str, fname: str
                 ) -> bool:
    """Probe gcc's copies of `fname` whose argument registers DWARF establishes."""
    image = facts.image
    planned = False
    for clone in image.clones_of(fname):
        kind = CLONE_RE.match(clone.name).group("kind")  # type: ignore[union-attr]
        if kind == "cold":
            plan.notes.append(f"{clone.name}: the cold tail of {fname}, entered from it; "
                              "nothing to probe")
            continue
        remapped = _remap_for_clone(role, facts, clone, fname)
        if isinstance(remapped, str):
            plan.problems.append(f"{role.role}: gcc made a copy {clone.name} of {fname} in "
                                 f"{module} ({kind} clone): calls to it bypass a probe on "
                                 f"{fname}, and {remapped}; rebuild with "
                                 f"__attribute__((noinline, noipa)) on {fname}")
            continue
        _plan_symbol(plan, remapped, image, module, clone,
                     f"{kind} clone of {fname}, arguments placed by DWARF; ")
        planned = True
    return planned


def _remap_for_clone(role: RoleSpec, facts: DwarfFacts, clone: Symbol, fname: str
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
                       initial_count=move(role.initial_count, "initial count"))
    except LookupError as err:
        return str(err)


def _type_or_unknown(src: Source | None, regs: dict[int, int]) -> Source | None:
    """A clone that dropped the type-name argument still counts, under a placeholder type."""
    if src is None or not src.arg:
        return src
    if src.arg in regs:
        return replace(src, arg=regs[src.arg])
    return Source(constant="<type not passed to clone>")



def _plan_usdt(plan: Plan, role: RoleSpec, image: ElfImage, module: str) -> None:
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


DEFAULT_LDSO = "/lib64/ld-linux-x86-64.so.2"


def find_ldso_probe(exe: ElfImage) -> LdsoProbe | None:
    """Locate the calls to _dl_debug_state and _r_debug in the program's ld.so."""
    interp = exe.interpreter() or DEFAULT_LDSO
    try:
        ldso = ElfImage(Path(interp).resolve())
    except BinaryError:
        return None
    state = ldso.symbols.get("_dl_debug_state")
    rdebug = ldso.data_symbol("_r_debug")
    if not state or rdebug is None:
        return None
    calls = _cached_call_sites(ldso, state[0].vaddr)
    sites = tuple((off, rdebug - vaddr) for vaddr in calls
                  if (off := ldso.vaddr_to_offset(vaddr)) is not None)
    return LdsoProbe(str(ldso.path), sites) if sites else None


def _cached_call_sites(ldso: ElfImage, target: int) -> list[int]:
    """Confirming call sites parses .eh_frame (0.1 s): kept per ld.so build-id."""
    cache = CACHE_DIR / f"ldso-{ldso.build_id}-{target:x}.json"
    if ldso.build_id:
        try:
            return [int(x) for x in json.loads(cache.read_text())]
        except (OSError, ValueError):
            pass
    calls = probepoint.call_sites(ldso, target)
    if ldso.build_id:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(calls))
    return calls
