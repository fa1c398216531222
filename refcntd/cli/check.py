"""`refcntd check`: what would be probed and how, without any kernel work."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from refcntd.cli import argtypes
from refcntd.cli.options import progress_arguments, spec_arguments
from refcntd.errors import EXIT_INCOMPLETE, ConfigError, EnvironmentProblem, UsageError

if TYPE_CHECKING:
    from refcntd.binary.plan import Plan
    from refcntd.kernel.program import KernelChoices

HELP = "show what would be probed and how, without tracing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--binary", required=True, help="executable or shared library")
    parser.add_argument("--pid", type=argtypes.PID,
                        help="also show the USDT semaphore values of this live process")
    spec_arguments(parser)
    progress_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from refcntd.binary.sitemode import parse_modes
    from refcntd.cli.stages import analyse
    from refcntd.inputs.spec import load_specs
    from refcntd.kernel import setup
    from refcntd.kernel.kheaders import INSTALL_HINT
    from refcntd.kernel.program import kernel_choices
    plan = analyse(load_specs(args.spec, allow_draft=True), args.binary,
                   parse_modes(args.probe_mode))
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        raise UsageError(f"no process {args.pid}")
    print(render_check(plan, args.pid))
    environment = setup.describe()
    print("\n".join(f"tracing {line}" for line in environment.lines()))
    choices = kernel_choices()
    print("\n".join(render_kernel(choices)))
    if environment.kernel_headers is None:  # what `run` would say, and its status
        raise EnvironmentProblem(environment.headers_problem, INSTALL_HINT)
    choices.require()
    if plan.spec.draft:  # run and attach refuse it with 2: the same status, once explained
        raise ConfigError(plan.spec.path, plan.spec.draft_line, "draft",
                          "a draft from `refcntd spec draft`: confirm each role and the "
                          "unplaced items (listed above), then delete this line")
    return EXIT_INCOMPLETE if plan.problems or plan.scan_gaps else 0


def render_check(plan: Plan, pid: int | None = None) -> str:
    lines = [f"spec {plan.spec.name} ({plan.spec.path})"]
    for mod in plan.modules.values():
        lines += [f"module {mod.path}",
                  f"  build-id: {mod.build_id or 'none (stacks resolvable only while it runs)'}",
                  f"  frame pointers: {mod.frame_pointers}",
                  f"  symbol table: {'.symtab and .dynsym' if mod.has_symtab else '.dynsym only'}"]
        if mod.path in plan.dwarf_cached:
            lines.append("  dwarf answers: " + ("from the analysis cache" if
                                                plan.dwarf_cached[mod.path] else "computed"))
        lines += render_usdt(plan, mod.path, pid)
    lines += render_modes(plan)
    for site in plan.sites:
        if site.mode != "entry":
            continue
        lines.append(f"{site.role:<6} {site.function} at 0x{site.symbol_vaddr:x}: probe "
                     f"+{site.probe_offset} (file offset 0x{site.file_offset:x}, {site.cost}"
                     f"{', return probe' if site.is_return else ''})")
        lines.append(f"         why: {site.reason}")
        if site.spec_role.unless_scanned:
            lines.append("         only without an exit scan (--no-leak-kinds, attach): "
                         "`run` reads the flag at the scan instead (unless_scanned)")
        caller = ("in the kernel's stack walk" if site.caller_sp_offset < 0
                  else f"read from [rsp+{site.caller_sp_offset}] at the probe")
        lines.append(f"         caller: {caller}")
    lines += render_existing(plan)
    lines += render_classes(plan)
    lines += [f"note: {n}" for n in plan.notes]
    lines += [f"PROBLEM: {p}" for p in plan.problems]
    lines += [f"UNPLACED (draft): {u}" for u in plan.spec.unplaced]
    lines += [f"INCOMPLETE: {n} {why}" for why, n in plan.scan_gaps.items()]
    if plan.spec.draft:
        lines.append(f"result: a DRAFT, not a spec yet (as proposed: {_verdict(plan)}): "
                     "confirm every role and the unplaced items above, then delete its "
                     "`draft: true` line to trace with it")
    else:
        lines.append("result: " + _verdict(plan))
    return "\n".join(lines)


def _verdict(plan: Plan) -> str:
    if plan.problems:
        return "cannot trace as it is: see the PROBLEM lines"
    if plan.scan_gaps:
        return "every role can be probed, but the DWARF scan is incomplete (see INCOMPLETE)"
    return "every role can be probed"


def render_existing(plan: Plan) -> list[str]:
    """Constructors that may return an object already live (spec: may_return_existing)."""
    return [f"may return an existing object: {', '.join(e.functions)}: "
            f"{e.may_return_existing.describe()}"
            for e in plan.spec.roles.get("init", ()) if e.may_return_existing]


def render_classes(plan: Plan) -> list[str]:
    """The spec's `class:` types, and whether GLib's layout was found where the traced
    program would load it (reach/gtypes.py reads the copy each process maps)."""
    from refcntd.binary.elf import ElfImage
    from refcntd.binary.gtypelayout import gobject_layout, quark_layout
    from refcntd.binary.libpaths import resolve_library
    from refcntd.errors import BinaryError
    from refcntd.reach import gtypes
    sources = plan.spec.class_sources()
    if not sources:
        return []
    lines = [f"class of {name} objects: {s.describe()}, read at the leak-kinds scan"
             for name, s in sorted(sources.items())]
    try:
        image = ElfImage(plan.binary)
        gobject = resolve_library(gtypes.GOBJECT_SONAME, image)
        glib = resolve_library(gtypes.GLIB_SONAME, image)
    except BinaryError as err:
        return [*lines, f"note: classes: GLib not found from {plan.binary} ({err}); read "
                        "from the copies a process maps, when it maps them"]
    found = gobject_layout(gobject) is not None and quark_layout(glib) is not None
    return [*lines, f"classes: GLib's type names {'found' if found else 'NOT found'} in "
                    f"{gobject} and {glib}" + ("" if found else
                                               ": objects keep the spec's type name")]


def render_modes(plan: Plan) -> list[str]:
    """Per probed function: entry or call sites, how many probes, their cost, and why."""
    lines = []
    for d in plan.decisions:
        sites = [s for s in plan.sites if s.mode == d.mode == "callsites"
                 and (s.function, s.callee_module or s.module) == (d.function, d.module)]
        shown = ", ".join(f"{s.site_kind} {Path(s.module).name + ':' if s.callee_module else ''}"
                          f"0x{s.symbol_vaddr + s.probe_offset:x}"
                          for s in sites[:4]) + (", ..." if len(sites) > 4 else "")
        lines.append(f"mode   {d.role} {d.function} at 0x{d.vaddr:x}: {d.mode}, "
                     f"{d.sites} probe(s), {d.cost}" + (f" [{shown}]" if shown else ""))
        lines.append(f"         why: {d.reason}")
    return lines


def render_usdt(plan: Plan, module: str, pid: int | None) -> list[str]:
    """The module's SDT probes, which spec role each serves, and live semaphore values."""
    from refcntd.binary.elf import ElfImage
    from refcntd.binary.sdt import semaphore_file_offset
    from refcntd.kernel.procmem import semaphore_value
    probes = plan.usdt.get(module, [])
    if not probes:
        return ["  usdt probes: none"]
    image = ElfImage(module)
    roles = {r.usdt: r.role for r in plan.spec.entries if r.usdt}
    lines = [f"  usdt probes: {len(probes)}"]
    for p in probes:
        sema = f"semaphore 0x{p.semaphore:x}" if p.semaphore else "no semaphore"
        used = f" -> {roles[p.full_name]}" if p.full_name in roles else ""
        lines.append(f"    {p.full_name} at 0x{p.pc:x}, {sema}, args: {p.arg_text or '-'}{used}")
        if pid is not None and p.semaphore:
            value = semaphore_value(pid, module, semaphore_file_offset(image, p))
            shown = "not mapped writable" if value is None else str(value)
            lines.append(f"      semaphore in pid {pid}: {shown}")
    return lines


def render_kernel(choices: KernelChoices) -> list[str]:
    """The feature table: each feature of the running kernel refcntd uses, whether it
    has it, and what refcntd does without it (the same decisions `run` takes)."""
    from refcntd.kernel.program import FEATURES
    found = choices.found
    lines = [f"kernel {found.release}: features (probed from the running kernel)"]
    for name, what, since, fallback in FEATURES:
        have = getattr(found, name)
        mark = {True: "yes", False: "NO ", None: "?  "}[have]
        line = f"  {mark} {what} (Linux {since})"
        if have is None:
            line += ": not probed (needs root); taken as present"
        elif not have:
            line += f": {fallback}" if fallback else ": required, no fallback"
        lines.append(line)
    lines.append("  attach: " + ("multi-uprobe links" if choices.multi
                                 else "one perf event per probe site"))
    exits = ("sched_process_exit's group_dead" if choices.group_dead else
             "task->signal->live at BTF offsets" if choices.live_offsets else "none")
    lines.append(f"  process exit: {exits}")
    return lines + [f"  PROBLEM: {line}" for line in choices.missing]
