"""The tracing status every report ends with: what each kernel counter means (a
loss makes the run incomplete, a note is shown), each probe's state, and the
spec entries that never fired."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

from refcntd.analysis.model import ProbeStatus
from refcntd.binary.elf import ElfImage
from refcntd.binary.libcopies import copy_of
from refcntd.binary.plan import Plan
from refcntd.errors import BinaryError
from refcntd.inputs.spec import RoleSpec
from refcntd.kernel.abi import STAT_TEXT
from refcntd.kernel.records import ProbeFailure

# What each kernel counter means for the report, from bpf/refcntd.h: a "loss"
# makes a run incomplete, a "note" is shown.
LOST_REASONS = {stat: text.removeprefix("loss: ") for stat, text in STAT_TEXT.items()
                if text.startswith("loss: ")}
NOTE_REASONS = {stat: text.removeprefix("note: ") for stat, text in STAT_TEXT.items()
                if text.startswith("note: ")}


UNMAPPED = "no probe fired in this run: no traced process mapped"


def silent_roles(plan: Plan, hits: list[int], loaded: Iterable[str]) -> list[str]:
    """Spec entries none of whose probes fired, in one note: where a traced process
    mapped their file (`loaded`: what ld.so loaded and exec ran) the probes were armed
    and the run did not call them (a test that needs no unref; a wrong function or a caller that
    bypasses it looks the same, so the note names the functions); where none did,
    nothing of theirs could be counted.  A run in which no probe fired is said once:
    "no probe fired" (run.py makes it INCOMPLETE where no probed file was mapped)."""
    silent = _silent(plan, hits)
    if not silent:
        return []
    armed = set(mapped_probed(plan, loaded))
    files = {_key(e): sorted({s.module for s in plan.sites if _key(s.spec_role) == _key(e)})
             for e in silent}
    idle = [e for e in silent if set(files[_key(e)]) & armed or not files[_key(e)]]
    unloaded = sorted({f for e in silent if e not in idle for f in files[_key(e)]})
    if not any(hits):  # nothing fired at all
        if idle:
            return [f"no probe fired in this run: traced processes mapped "
                    f"{', '.join(sorted(armed))} and never called the spec's functions "
                    "(nothing to count)"]
        return [f"{UNMAPPED} {', '.join(unloaded)}, where the spec's functions are probed"]
    out = []
    if idle:
        out.append("spec roles never fired in this run (not called; or called another way, "
                   "if the program does use them): " + "; ".join(map(_named, idle)))
    if unloaded:
        out.append(f"spec roles never fired in this run, their file never mapped by a traced "
                   f"process ({', '.join(unloaded)}): "
                   + "; ".join(_named(e) for e in silent if e not in idle))
    return out


def _named(entry: RoleSpec) -> str:
    return f"{entry.role} ({entry.usdt or ', '.join(entry.functions)})"


def unprobed_copies(plan: Plan, hits: list[int], loaded: Iterable[str]) -> dict[str, int]:
    """Library roles that never fired while a traced process loaded another copy of
    their library than the one probed (uprobes are per file): the run did not count
    what it was asked to, so it is incomplete; one line per copy, saying which copy
    was loaded and which the spec names, with the number of silent roles."""
    silent: dict[str, dict[str, None]] = {}  # module -> its silent roles, in spec order
    for entry in _silent(plan, hits):
        module = next((s.callee_module or s.module for s in plan.sites
                       if _key(s.spec_role) == _key(entry)), None)  # (a call site's callee)
        if entry.library and module:
            silent.setdefault(module, {})[entry.role] = None
    out: dict[str, int] = {}
    for module, roles in silent.items():
        try:
            image = ElfImage(module)
        except BinaryError:
            continue
        for copy in filter(None, (copy_of(p, image) for p in sorted(set(loaded)))):
            out[f"spec role(s) never fired ({', '.join(roles)}) while a traced process "
                f"loaded {copy.path}, {copy.relation} the library the spec names "
                f"({plan.named.get(module, module)}): name the loaded copy in the spec's "
                "`library:`"] = len(roles)
    return out


def nothing_loaded(plan: Plan, loaded: Iterable[str]) -> str | None:
    """The one note of a run that demonstrably had nothing of the spec's library to count
    (GLib's test `bytes` under the gobject spec), given every file its traced processes
    loaded or ran (ld.so's reports and the execs: the caller knows ld.so was watched):
    none is a probed file or another copy of one (issue 39's copies), and none that has a
    symbol table defines one of the spec's functions (a copy linked in statically).  None
    where that cannot be shown, and the run stays INCOMPLETE: a role of the traced program
    itself or a USDT one, a file unreadable here (another mount namespace), a relative path."""
    entries = plan.spec.entries
    if plan.deferred or any(e.library is None or e.usdt for e in entries):
        return None
    try:
        probed = [ElfImage(m) for m in sorted({s.module for s in plan.sites})]
    except BinaryError:
        return None
    functions = {f for e in entries for f in e.functions}
    files = sorted({p for p in loaded if "/" in p})  # (ld.so names the vdso without one)
    if not probed or not all(map(os.path.isabs, files)):
        return None
    for path in files:
        if any(_identity(path) == _identity(str(i.path)) or copy_of(path, i) for i in probed):
            return None
        try:
            if functions & ElfImage(path).symbols.keys():
                return None
        except BinaryError:
            return None
    names = ", ".join(sorted({i.soname() or i.path.name for i in probed}))
    return (f"{NOTHING_LOADED}: no traced process loaded {names} or another copy, and none "
            f"of the {len(files)} files they loaded or ran defines the spec's functions")


NOTHING_LOADED = "no probe fired in this run: nothing of the spec's library was loaded"


def mapped_probed(plan: Plan, paths: Iterable[str]) -> list[str]:
    """The probed files a traced process mapped (ld.so's list, an exec), by identity
    (ld.so names a library by its soname link): there the probes were armed, so none
    firing means the process never called the spec's functions, not that it went unseen."""
    probed = {_identity(m): m for m in {s.module for s in plan.sites}}
    probed.pop(None, None)
    return sorted({probed[i] for i in map(_identity, filter(os.path.isabs, paths))
                   if i in probed})


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # gone, or in a mount namespace refcntd does not see
        return None
    return st.st_dev, st.st_ino


Key = tuple[str, tuple[str, ...], str | None]


def _key(entry: RoleSpec) -> Key:
    return entry.role, entry.functions, entry.usdt  # a gcc clone's entry is remapped


def _silent(plan: Plan, hits: list[int]) -> list[RoleSpec]:
    fired: dict[Key, int] = {}
    for site, n in zip(plan.sites, hits, strict=True):
        fired[_key(site.spec_role)] = fired.get(_key(site.spec_role), 0) + n
    return [entry for entry in plan.spec.entries if fired.get(_key(entry)) == 0]


def probe_statuses(plan: Plan, failures: Iterable[ProbeFailure],
                   hits: list[int] | None = None) -> list[ProbeStatus]:
    """One status per entry probe, and one per function for all of its call sites; a
    failure names its site by index, never by text."""
    failed = {f.site_index: f for f in failures}
    hits = hits if hits is not None else [-1] * len(plan.sites)
    out: dict[tuple[str, str, str, int], ProbeStatus] = {}
    for i, (s, n) in enumerate(zip(plan.sites, hits, strict=True)):
        failure = failed.get(i)
        error = f"{failure.stage} failed: {failure.message}" if failure else ""
        key = (s.role, s.function, s.module, i if s.mode == "entry" else -1)
        old = out.get(key)
        if old is None:
            reason = next((d.reason for d in plan.decisions if (d.role, d.function, d.module)
                           == key[:3] and d.mode == s.mode), s.reason) if s.mode != "entry" \
                else s.reason
            out[key] = ProbeStatus(s.role, s.function, s.module, s.probe_offset, s.cost, reason,
                                   not error, error, s.mode, 1, n)
            continue
        worst = s.cost if s.cost == "single-step" else old.cost
        out[key] = replace(old, cost=worst, installed=old.installed and not error,
                           error=old.error or error, sites=old.sites + 1,
                           hits=old.hits + n)
    return list(out.values())


