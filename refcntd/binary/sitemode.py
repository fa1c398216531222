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
from collections.abc import Callable
from dataclasses import astuple, dataclass, field

from refcntd.binary import callsites, probepoint
from refcntd.binary.callsites import KIND_CALL, KIND_JMP, ModuleScan, Site, TargetScan
from refcntd.binary.elf import ElfImage, Symbol
from refcntd.errors import BinaryError, UsageError
from refcntd.paths import CACHE_DIR

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


_SCANS: dict[tuple[str, int], dict[int, TargetScan]] = {}


def module_scan(image: ElfImage, targets: dict[int, str]) -> dict[int, TargetScan]:
    """One sweep per module and target set (a plan asks for each role in turn), kept on
    disk per build-id: sweeping a large program takes seconds, and attach must be fast."""
    key = (str(image.path), hash(frozenset(targets.items())))
    if key not in _SCANS:
        _SCANS[key] = _cached_scan(image, targets)
    return _SCANS[key]


def _cached_scan(image: ElfImage, targets: dict[int, str]) -> dict[int, TargetScan]:
    digest = hashlib.sha1(json.dumps(sorted(targets.items())).encode()).hexdigest()[:16]
    cache = CACHE_DIR / f"callsites-{image.build_id}-{digest}.json"
    if image.build_id:
        try:
            return {int(t): TargetScan(int(t), [Site(*s) for s in v["sites"]], v["blockers"])
                    for t, v in json.loads(cache.read_text()).items()}
        except (OSError, ValueError, TypeError, KeyError):
            pass
    results = ModuleScan(image, targets).results
    if image.build_id:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({t: {"sites": [astuple(s) for s in r.sites],
                                             "blockers": r.blockers}
                                         for t, r in results.items()}))
    return results


def plan_call_sites(image: ElfImage, sym: Symbol, scan: dict[int, TargetScan],
                    is_return: bool, saves_args: bool,
                    neighbours: Callable[[], list[ElfImage]] = list) -> CallSitePlan:
    """The probes that replace an entry probe on `sym`, or why they would miss calls.

    `neighbours`: modules loaded with it, named in the reason when they import it."""
    found = scan[sym.vaddr]
    plan = CallSitePlan(blockers=list(found.blockers))
    if callsites.dynamic_export(image, sym.name):
        users = [str(m.path) for m in neighbours() if callsites.imports(m, sym.name)]
        known = f"; imported by {', '.join(users)}" if users else ""
        plan.blockers.insert(0, f"{sym.name} is exported in .dynsym of {image.path}: other "
                                "modules (PLT imports, dlsym, libraries loaded later) can "
                                f"call it{known}")
    for site in found.sites:
        plan.points += _points(image, sym, site, is_return, saves_args, plan.blockers)
    return plan


def _points(image: ElfImage, sym: Symbol, site: Site, is_return: bool, saves_args: bool,
            blockers: list[str]) -> list[SitePoint]:
    where = f"{site.caller or '?'} at 0x{site.vaddr:x}"
    if not is_return:
        return [_point(image, site.vaddr, site.kind, site, probepoint.COST_EMULATED,
                       -1 if site.kind == KIND_CALL else 0)]
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
    out = [_point(image, site.after, "return", site, probepoint.cost_of(after), -1)]
    if saves_args:
        out.append(_point(image, site.vaddr, "save", site, probepoint.COST_EMULATED, -1))
    return out


def _point(image: ElfImage, vaddr: int, kind: str, site: Site, cost: str,
           caller_sp: int) -> SitePoint:
    offset = image.vaddr_to_offset(vaddr)
    return SitePoint(vaddr, -1 if offset is None else offset, kind, site.caller, cost,
                     caller_sp, site.length, site.cond if kind == KIND_JMP else 0)


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
        return MODE_CALLSITES, f"call sites forced (--probe-mode callsites): {n} probe(s)"
    if isinstance(entry, probepoint.Refusal):
        return MODE_CALLSITES, f"{entry.reason}; all {n} call-site probe(s) found instead"
    if entry.cost == probepoint.COST_SINGLE_STEP and calls.cost != probepoint.COST_SINGLE_STEP:
        return MODE_CALLSITES, (f"the entry probe would be single-stepped ({entry.instruction}); "
                                f"all {n} call-site probe(s) are emulated")
    if entry.cost == probepoint.COST_SINGLE_STEP:
        return MODE_ENTRY, ("its call sites would be single-stepped too (the instruction after "
                            "a constructor's call): one entry probe")
    return MODE_ENTRY, f"the entry probe is {entry.cost}: one probe, no call sites needed"


def scan_targets(image: ElfImage, names: list[str], clone_of: Callable[[str], list[Symbol]]
                 ) -> dict[int, str]:
    """Every address the spec's functions (and gcc's copies of them) live at."""
    targets: dict[int, str] = {}
    for name in names:
        for sym in image.symbols.get(name, []) + clone_of(name):
            targets.setdefault(sym.vaddr, sym.name)
    return targets


_NEIGHBOURS: dict[tuple[str, str], list[ElfImage]] = {}


def neighbours(binary: str, image: ElfImage,
               resolve: Callable[[str, ElfImage], str]) -> list[ElfImage]:
    """The traced program and the libraries it and `image` load at start (DT_NEEDED,
    found by `resolve` the way ld.so would): the importers `check` can name."""
    key = (binary, str(image.path))
    if key not in _NEIGHBOURS:
        out = [ElfImage(binary)] if binary and binary != str(image.path) else []
        for owner in [image, *out]:
            for soname in callsites.needed(owner):
                with contextlib.suppress(BinaryError):
                    out.append(ElfImage(resolve(soname, owner)))
        _NEIGHBOURS[key] = [m for m in out if m.path.resolve() != image.path.resolve()]
    return _NEIGHBOURS[key]
