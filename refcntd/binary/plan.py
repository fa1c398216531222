"""Binary analysis: turn a spec and a binary into the list of probes to place.

Pure file analysis (no root, no bcc) so `refcntd check` and the unit tests
run anywhere.  Here: the Plan, and each role's functions (and gcc's copies of
them) planned at their entry; the rest of the planner is beside it:
probesite.py (ProbeSite and its constructors), callsiteplan.py (call-site
probes), usdtplan.py (USDT probes), clones.py (gcc's copies), libpaths.py
(finding libraries), ldso.py (the ld.so probe).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from refcntd.binary import dwarfinfo, probepoint, sdt, sitemode, specchecks
from refcntd.binary.analysiscache import DwarfFacts
from refcntd.binary.callsiteplan import try_call_sites
from refcntd.binary.clones import remap_for_clone
from refcntd.binary.elf import CLONE_RE, ElfImage, Symbol
from refcntd.binary.ldso import LdsoProbe, find_ldso_probe
from refcntd.binary.libcopies import loaded_copy
from refcntd.binary.libpaths import resolve_spec_library
from refcntd.binary.probesite import CrossModule, ProbeSite, entry_sites, needed_args
from refcntd.binary.usdtplan import plan_usdt
from refcntd.errors import ConfigError, ConfigErrors, ProbeError
from refcntd.inputs.rootpaths import resolve
from refcntd.inputs.spec import RoleSpec, Spec

FP_SAMPLE = 400


@dataclass
class ModuleInfo:
    path: str
    build_id: str | None
    has_symtab: bool

    @property
    def frame_pointers(self) -> str:
        """Computed when shown (check): it disassembles hundreds of functions."""
        return frame_pointer_summary(ElfImage(self.path))


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
    # function names the spec gives that a module with a symbol table lacks: spec errors
    missing: list[ConfigError] = field(default_factory=list)
    # run: the command has none of the functions of these roles; the programs it execs
    # are scanned for them instead (session/execscan.py)
    deferred: list[str] = field(default_factory=list)
    # traced module -> the file the spec's `library:` names (another copy, same build)
    named: dict[str, str] = field(default_factory=dict)

    def require_complete(self) -> None:
        if self.problems:
            raise ProbeError(self.problems[0], "run `refcntd check` for the full analysis")


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


def build_plan(spec: Spec, binary: str, probe_modes: dict[str, str] | None = None,
               execs_later: bool = False) -> Plan:
    """Analyse `binary` (and the libraries the spec names) for every role of `spec`.

    `execs_later` (run): a command that has none of the functions of the roles
    without a library (a shell, `make`) is not an error; those roles are left to
    the programs it execs (`deferred`)."""
    plan = Plan(spec, binary=binary)
    if probe_modes:
        plan.probe_modes = probe_modes
    main = ElfImage(binary)
    images: dict[str, ElfImage] = {resolve(main.path): main}
    facts: dict[str, DwarfFacts] = {}
    libraries = {name: _traced_library(plan, name, main, images)
                 for name in dict.fromkeys(r.library for r in spec.entries if r.library)}
    modules: dict[str, str | None] = {"": resolve(main.path), **libraries}
    spec, skipped = specchecks.for_this_build(spec, modules, images)
    plan.spec = spec
    plan.notes += skipped
    if execs_later and not any(defines(main, r.functions) for r in spec.entries
                               if not r.library and not r.usdt):
        plan.deferred = sorted({r.role for r in spec.entries if not r.library and not r.usdt})
    try:
        for role in spec.entries:
            if role.role in plan.deferred and not role.library and not role.usdt:
                continue
            module = resolve(main.path)
            if role.library:
                module = libraries[role.library]
            if role.usdt:
                plan_usdt(plan, role, images[module], module)
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
    if plan.missing:  # every name at once, as a compiler reports its errors
        raise plan.missing[0] if len(plan.missing) == 1 else ConfigErrors(plan.missing)
    plan.dwarf_cached = {m: f.loaded for m, f in facts.items()}
    plan.problems += specchecks.double_counts(spec, modules, images)
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


def _traced_library(plan: Plan, library: str, main: ElfImage, images: dict[str, ElfImage]
                    ) -> str:
    """The file traced for a spec's `library:`: the copy `main` loads when it is the same
    build as the one the spec names (uprobes are per file: the named copy would never
    fire), else the named one; either way the copy `main` loads is said."""
    module = resolve_spec_library(library, main)
    if module not in images:
        images[module] = ElfImage(module)
    image = images[module]
    copy = loaded_copy(image, main)
    if copy is None:
        return module
    if not copy.same_build:
        plan.notes.append(f"the spec names {module}; {main.path.name} loads {copy.path}, "
                          "another build: only processes that load the named file are counted, "
                          "and a run whose roles never fire is incomplete")
        return module
    plan.notes.append(f"the spec names {module}; {main.path.name} loads {copy.path}, the same "
                      f"build (build-id {image.build_id or 'none, same contents'}): traced there")
    plan.named[copy.path] = module
    if copy.path not in images:
        images[copy.path] = ElfImage(copy.path)
    return copy.path


def defines(image: ElfImage, functions: tuple[str, ...]) -> bool:
    """Whether `image` has a symbol for one of `functions` (or a compiler clone of one)."""
    names = set(functions)
    return any(name.split(".")[0] in names for name in image.symbols)


def _plan_role(plan: Plan, role: RoleSpec, facts: DwarfFacts, module: str) -> None:
    image = facts.image
    found_any = False
    absent = []
    for fname in role.functions:
        syms = image.symbols.get(fname, [])
        for sym in syms:
            _plan_symbol(plan, role, image, module, sym)
        clones = _plan_clones(plan, role, facts, module, fname)
        found_any = found_any or bool(syms) or clones
        if not syms and not clones:
            absent.append(fname)
    scan = facts.inlined_copies(set(role.functions))
    _note_scan_gaps(plan, role, module, scan)
    inlined = scan.copies
    absent = [f for f in absent if f not in {c.function for c in inlined}]
    if absent and image.has_symtab and scan.complete:  # (else perhaps inlined where unread)
        plan.missing += [_missing_name(plan.spec.path, role, f, image, module) for f in absent]
        return
    for copy in inlined:
        plan.problems.append(
            f"{role.role}: {copy.function} was inlined at {copy.count} call site(s) in {module} "
            f"({', '.join(copy.sites)}): those calls cannot be probed and counts would be wrong; "
            f"mark it __attribute__((noinline))")
    if not found_any and not inlined:
        names = ", ".join(role.functions)
        where = module if image.has_symtab else f"{module} (stripped: no .symtab)"
        plan.problems.append(f"{role.role}: no function {names} in {where}")


def _missing_name(spec_path: str, role: RoleSpec, fname: str, image: ElfImage, module: str
                  ) -> ConfigError:
    """A name the module's full symbol table lacks is the spec's mistake (a typo, or the
    wrong binary): said where the spec writes it, with the module's closest names."""
    path, line, key = dict(zip(role.functions, role.written_at, strict=False)).get(
        fname, (spec_path, 0, f"roles.{role.role}.functions"))
    close = difflib.get_close_matches(fname, list(image.symbols), n=3, cutoff=0.6)
    hint = (f"; did you mean {close[0]!r}?" + (f" (also close: {', '.join(map(repr, close[1:]))})"
                                               if close[1:] else "")) if close else ""
    return ConfigError(path, line, key, f"{role.role}: no function {fname} in {module}{hint}")


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
    why_entry = try_call_sites(plan, role, image, module, sym, choice, why_prefix, code)
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
    sites, problem = entry_sites(role, image, module, sym, code, choice,
                                 why_prefix + choice.reason + kept)
    plan.sites += sites
    if problem:
        plan.problems.append(problem)


def _plan_clones(plan: Plan, role: RoleSpec, facts: DwarfFacts, module: str, fname: str
                 ) -> bool:
    """Probe gcc's copies of `fname` whose argument registers DWARF establishes."""
    image = facts.image
    planned = False
    own = {s.vaddr for s in image.symbols.get(fname, [])}
    for clone in image.clones_of(fname):
        kind = CLONE_RE.match(clone.name).group("kind")  # type: ignore[union-attr]
        if clone.vaddr in own:  # a .localalias: the same code under a local name
            plan.notes.append(f"{clone.name}: {fname}'s own code under a local name (gcc's "
                              "alias for calls inside the library): its probe counts them")
            continue
        if kind == "cold":
            plan.notes.append(f"{clone.name}: the cold tail of {fname}, entered from it; "
                              "nothing to probe")
            continue
        remapped = remap_for_clone(role, facts, clone, fname)
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


