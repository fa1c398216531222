"""Choose, per probed function, between an entry probe and its call sites.

An entry probe is one uprobe, but the kernel single-steps it when the
function begins with an instruction it cannot emulate (-O2 stubs: `lock
add`).  Call-site probes sit on `call rel32` / `jmp` instructions, which the
kernel emulates, but they are only correct when every way into the function
is one of them (see callsites.py).  `auto` takes call sites when the entry
would be single-stepped or refused and the call sites are provably complete;
`entry` and `callsites` force a mode (for tests and comparisons; a forced
`callsites` still keeps the entry probe where the call sites are incomplete).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from refcntd.binary import callsites, probepoint
from refcntd.binary.callsites import KIND_CALL, KIND_JMP, ModuleScan, Site, TargetScan
from refcntd.binary.elf import ElfImage, Symbol
from refcntd.errors import BinaryError, UsageError
from refcntd.inputs import rootpaths
from refcntd.inputs.files import FileStamp, file_stamp
from refcntd.paths import CACHE_DIR, read_cache_json, write_cache_json

MODE_ENTRY = "entry"
MODE_CALLSITES = "callsites"
MODE_AUTO = "auto"
MODES = (MODE_ENTRY, MODE_CALLSITES, MODE_AUTO)
ROLE_NAMES = ("init", "get", "put", "delete")
SHOWN_BLOCKERS = 3


@dataclass(frozen=True)
class SitePoint:
    """One call-site probe: where, and what the BPF side must do there."""

    vaddr: int
    file_offset: int
    kind: str  # "call" / "jmp" (counts like an entry probe), "return" (after a call), "save"
    caller: str
    cost: str
    caller_sp: int  # like ProbePoint.caller_sp_offset
    length: int  # of the branch instruction
    cond: int = 0  # Site.cond
    module: str = ""  # the file the probe is in, when not the function's own (a PLT caller)


@dataclass(frozen=True)
class ModeDecision:
    """What `check` shows per probed function: the mode, the sites, the cost and why."""

    role: str
    function: str
    module: str
    mode: str
    sites: int
    cost: str
    reason: str
    blockers: tuple[str, ...] = ()
    vaddr: int = 0  # the function's


@dataclass
class CallSitePlan:
    points: list[SitePoint] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    importers: list[str] = field(default_factory=list)  # other modules whose PLT calls are probed
    later: bool = False  # an exported function: modules mapped later are scanned as they come

    @property
    def cost(self) -> str:
        costs = {p.cost for p in self.points}
        return probepoint.COST_SINGLE_STEP if probepoint.COST_SINGLE_STEP in costs \
            else probepoint.COST_EMULATED


def parse_modes(text: str | None) -> dict[str, str]:
    """`auto`, `callsites`, or `get=callsites,put=entry`: a mode per role ('*': default)."""
    if not text:
        return {"*": MODE_AUTO}
    modes: dict[str, str] = {"*": MODE_AUTO}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        role, _, mode = part.rpartition("=")
        if mode not in MODES:
            raise UsageError(f"--probe-mode {text}: '{mode}' is not one of {', '.join(MODES)}")
        modes[role or "*"] = mode
    return modes


def mode_for(modes: dict[str, str], role: str) -> str:
    base = "init" if role == "init_entry" else role
    return modes.get(base, modes.get("*", MODE_AUTO))


ScanKey = tuple[frozenset[tuple[int, str]], frozenset[int]]
# per image (a file replaced in place is read into a new one), gone with it
_SCANS: weakref.WeakKeyDictionary[ElfImage, dict[ScanKey, dict[int, TargetScan]]] = \
    weakref.WeakKeyDictionary()


def module_scan(image: ElfImage, targets: dict[int, str],
                plt_slots: frozenset[int] = frozenset()) -> dict[int, TargetScan]:
    """One sweep per module and target set (a plan asks for each role in turn), kept on
    disk per build-id: sweeping a large program takes seconds, and attach must be fast.
    Kept in memory with the image it swept: by path, an upgrade whose probed functions
    kept their addresses was given the old build's call sites (uprobes inside the new
    build's instructions), and every build serve ever saw stayed in memory."""
    scans = _SCANS.setdefault(image, {})
    key = (frozenset(targets.items()), plt_slots)
    if key not in scans:
        scans[key] = _cached_scan(image, targets, plt_slots)
    return scans[key]


def _cached_scan(image: ElfImage, targets: dict[int, str], plt_slots: frozenset[int]
                 ) -> dict[int, TargetScan]:
    described = json.dumps([sorted(targets.items()), sorted(plt_slots)])
    digest = hashlib.sha1(described.encode()).hexdigest()[:16]
    cache = CACHE_DIR / f"callsites-{image.build_id}-{digest}.json"
    if image.build_id:
        try:
            entries = read_cache_json(cache)  # None: AttributeError below
            return {int(t): TargetScan(int(t), [Site(*s) for s in v["sites"]], v["blockers"])
                    for t, v in entries.items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            pass
    results = ModuleScan(image, targets, plt_slots).results
    if image.build_id:
        write_cache_json(cache, {t: {"sites": [_row(s) for s in r.sites],
                                     "blockers": r.blockers} for t, r in results.items()})
    return results


def _row(site: Site) -> tuple[int, int, str, str, int, bool, int]:
    """Site's fields in order (dataclasses.astuple deep-copies: 0.3 s for 24 000 sites)."""
    return (site.vaddr, site.length, site.kind, site.caller, site.after,
            site.after_exclusive, site.cond)


def plan_call_sites(image: ElfImage, sym: Symbol, scan: dict[int, TargetScan],
                    is_return: bool, saves_args: bool,
                    load_set: Callable[[], list[ElfImage]] | None = None) -> CallSitePlan:
    """The probes that replace an entry probe on `sym`, or why they would miss calls.

    An exported function is also called by other modules through their PLT:
    with `load_set` (the program and the libraries ld.so loads with it, in its
    search order) those calls are probed too, and modules mapped later are
    scanned when they are mapped (session/vetting.py); without it, the
    export is a blocker."""
    found = scan[sym.vaddr]
    plan = CallSitePlan(blockers=list(found.blockers))
    for site in found.sites:
        plan.points += _points(image, site, is_return, saves_args, plan.blockers)
    if not callsites.dynamic_export(image, sym.name):
        return plan
    if load_set is None:
        plan.blockers.insert(0, f"{sym.name} is exported in .dynsym of {image.path}: other "
                                "modules (PLT imports, dlsym, libraries loaded later) can "
                                "call it, and the modules loaded later cannot be followed here")
        return plan
    plan.later = True
    for stub, _slot in callsites.plt_stubs(image).get(sym.name, []):  # its own PLT calls:
        for site in scan[stub].sites:  # swept with it (scan_targets)
            plan.points += _points(image, site, is_return, saves_args, plan.blockers)
        plan.blockers += scan[stub].blockers
    modules = load_set()
    own = next((i for i, m in enumerate(modules) if _same_file(m, image)), len(modules))
    for earlier in modules[:own]:
        if callsites.dynamic_export(earlier, sym.name):
            plan.blockers.append(f"{earlier.path} also defines {sym.name} and ld.so searches "
                                 "it first: calls bound there are not calls to this one")
    for module in modules:
        if not _same_file(module, image) and callsites.imports(module, sym.name):
            found_there = importer_plan(module, sym.name, is_return, saves_args)
            plan.points += found_there.points
            plan.blockers += found_there.blockers
            plan.importers.append(str(module.path))
    return plan


def importer_plan(module: ElfImage, name: str, is_return: bool, saves_args: bool
                  ) -> CallSitePlan:
    """The calls `module` makes to the imported `name` (through its PLT), as probes in
    `module`, or why some calls cannot be probed (its address taken through the GOT)."""
    where = str(module.path)
    plan = CallSitePlan(blockers=[f"{where}: {b}" for b in
                                  callsites.address_imports(module, name)])
    stubs = callsites.plt_stubs(module).get(name, [])
    if not stubs and not plan.blockers:
        plan.blockers.append(f"{where} imports {name} but has no PLT stub or GOT slot for it")
    targets = {stub: f"{name}@plt" for stub, _ in stubs}
    scan = module_scan(module, targets, frozenset(slot for _, slot in stubs)) if stubs else {}
    for stub, _ in stubs:
        blockers: list[str] = []
        for site in scan[stub].sites:
            plan.points += _points(module, site, is_return, saves_args, blockers, where)
        plan.blockers += [f"{where}: {b}" for b in scan[stub].blockers + blockers]
    return plan


def _same_file(a: ElfImage, b: ElfImage) -> bool:
    return rootpaths.resolve(a.path) == rootpaths.resolve(b.path)


def _points(image: ElfImage, site: Site, is_return: bool, saves_args: bool,
            blockers: list[str], module: str = "") -> list[SitePoint]:
    where = f"{site.caller or '?'} at 0x{site.vaddr:x}"
    if not is_return:
        return [_point(image, site.vaddr, site.kind, site, probepoint.COST_EMULATED,
                       -1 if site.kind == KIND_CALL else 0, module)]
    if site.kind != KIND_CALL:
        blockers.append(f"tail jump from {where}: the constructor returns into an unknown "
                        "caller, where no probe can wait for it")
        return []
    after = probepoint.first_instruction(image.code_at(site.after, 16))
    if not site.after_exclusive or after is None:
        blockers.append(f"the instruction after the call in {where} can be reached by other "
                        "jumps: a probe there would fire for them too")
        return []
    refused = probepoint.refused_reason(after)
    if refused:
        blockers.append(f"the instruction after the call in {where} cannot be probed "
                        f"({refused})")
        return []
    out = [_point(image, site.after, "return", site, probepoint.cost_of(after), -1, module)]
    if saves_args:
        out.append(_point(image, site.vaddr, "save", site, probepoint.COST_EMULATED, -1, module))
    return out


def _point(image: ElfImage, vaddr: int, kind: str, site: Site, cost: str,
           caller_sp: int, module: str) -> SitePoint:
    offset = image.vaddr_to_offset(vaddr)
    return SitePoint(vaddr, -1 if offset is None else offset, kind, site.caller, cost,
                     caller_sp, site.length, site.cond if kind == KIND_JMP else 0, module)


def decide(requested: str, entry: probepoint.ProbePoint | probepoint.Refusal,
           calls: CallSitePlan | None) -> tuple[str, str]:
    """(mode, why) for one function."""
    if requested == MODE_ENTRY or calls is None:
        return MODE_ENTRY, "entry probe forced (--probe-mode entry)"
    if calls.blockers:
        shown = "; ".join(calls.blockers[:SHOWN_BLOCKERS])
        more = len(calls.blockers) - SHOWN_BLOCKERS
        extra = f" (and {more} more)" if more > 0 else ""
        return MODE_ENTRY, f"entry probe kept: its call sites cannot all be found: {shown}{extra}"
    n = len(calls.points)
    if requested == MODE_CALLSITES:
        return MODE_CALLSITES, (f"call sites forced (--probe-mode callsites): {n} probe(s)"
                                f"{_elsewhere(calls)}")
    if isinstance(entry, probepoint.Refusal):
        return MODE_CALLSITES, (f"{entry.reason}; all {n} call-site probe(s) found instead"
                                f"{_elsewhere(calls)}")
    if entry.cost == probepoint.COST_SINGLE_STEP and calls.cost != probepoint.COST_SINGLE_STEP:
        return MODE_CALLSITES, (f"the entry probe would be single-stepped ({entry.instruction}); "
                                f"all {n} call-site probe(s) are emulated{_elsewhere(calls)}")
    if entry.cost == probepoint.COST_SINGLE_STEP:
        return MODE_ENTRY, ("its call sites would be single-stepped too (the instruction after "
                            "a constructor's call): one entry probe")
    return MODE_ENTRY, f"the entry probe is {entry.cost}: one probe, no call sites needed"


def _elsewhere(calls: CallSitePlan) -> str:
    """What an exported function's call-site mode also covers, for `check`."""
    if not calls.later:
        return ""
    users = f"PLT calls from {', '.join(calls.importers)} included; " if calls.importers else ""
    return (f" ({users}exported: every module mapped later is scanned for calls to it "
            "while its process waits, stopped; a module taking its address, or dlsym "
            "returning it, moves it back to its entry probe)")


def scan_targets(image: ElfImage, names: list[str], clone_of: Callable[[str], list[Symbol]]
                 ) -> tuple[dict[int, str], frozenset[int]]:
    """Every address the spec's functions (and gcc's copies of them) live at, and the
    module's own PLT stubs for them (a library calling its exported function through
    its PLT), with those stubs' GOT slots."""
    targets: dict[int, str] = {}
    for name in names:
        for sym in image.symbols.get(name, []) + clone_of(name):
            targets.setdefault(sym.vaddr, sym.name)
    slots: set[int] = set()
    stubs = callsites.plt_stubs(image)
    for name in names:
        for stub, slot in stubs.get(name, []):
            targets.setdefault(stub, f"{name}@plt")
            slots.add(slot)
    return targets, frozenset(slots)


MAX_LOAD_SETS = 8  # programs whose load sets are kept: each holds its files' bytes
Stamped = tuple[list[ElfImage], list[FileStamp | None]]  # the modules, their file_stamps
_LOAD_SETS: dict[tuple[str, str], Stamped] = {}  # least recently used first


def load_set(binary: str, image: ElfImage, resolve: Callable[[str, ElfImage], str]
             ) -> list[ElfImage]:
    """The traced program and every library ld.so loads with it (DT_NEEDED, transitively,
    breadth first as ld.so searches them), found by `resolve` the way ld.so would; a
    traced library is followed by its own dependencies.  Kept for the next plan of the
    same program (serve re-plans) while none of its files has changed since it was read
    (an upgraded library has other call sites)."""
    key = (binary, str(image.path))
    kept = _LOAD_SETS.pop(key, None)
    if kept is None or [file_stamp(m.path) for m in kept[0]] != kept[1]:
        kept = _read_load_set(binary, image, resolve)
    _LOAD_SETS[key] = kept
    while len(_LOAD_SETS) > MAX_LOAD_SETS:
        _LOAD_SETS.pop(next(iter(_LOAD_SETS)), None)
    return kept[0]


def _read_load_set(binary: str, image: ElfImage, resolve: Callable[[str, ElfImage], str]
                   ) -> Stamped:
    order: list[ElfImage] = []
    stamps = {image.path: file_stamp(image.path)}
    seen: set[Path] = set()

    def read(path: str | Path) -> ElfImage:
        stamp = file_stamp(path)  # before the read: a change meanwhile shows next time
        module = ElfImage(path)
        stamps[module.path] = stamp
        return module
    roots = [read(binary)] if binary and binary != str(image.path) else []
    for start in [*roots, image]:  # the traced library last, if the program lacks it
        if Path(rootpaths.resolve(start.path)) in seen:
            continue
        seen.add(Path(rootpaths.resolve(start.path)))
        queue = [start]
        while queue:
            module = queue.pop(0)
            order.append(module)
            for soname in callsites.needed(module):
                with contextlib.suppress(BinaryError):
                    real = Path(rootpaths.resolve(resolve(soname, module)))
                    if real not in seen:  # each file read once, not once per importer
                        seen.add(real)
                        queue.append(read(real))
    return order, [stamps[m.path] for m in order]
