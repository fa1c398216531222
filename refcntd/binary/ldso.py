"""The ld.so probe: where ld.so calls _dl_debug_state(), so that the BPF side learns
each loaded library's path (frames in libraries unloaded before exit resolve).

_dl_debug_state and _r_debug are the debugger's interface (gdb breaks there), on
every glibc; the SDT notes some builds add are not needed.  How ld.so reaches the
function differs: bookworm's glibc 2.36 calls it from six places, trixie's 2.41
tail-jumps to it from _dl_debug_change_state (two `jmp`s, no `call`)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from refcntd.binary import probepoint
from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.inputs.rootpaths import beside
from refcntd.paths import CACHE_DIR


@dataclass(frozen=True)
class LdsoProbe:
    """Where ld.so calls _dl_debug_state(): the BPF side learns each loaded
    library's path there.  The call and tail-jump sites, not the function: its
    body is a `ret` the kernel would single-step (out of line, in every process
    that loads a library), a `call` or `jmp` it emulates.  The function's entry
    only when no site is found."""

    path: str
    sites: tuple[tuple[int, int], ...]  # (file offset, _r_debug minus the site's address)


DEFAULT_LDSO = "/lib64/ld-linux-x86-64.so.2"


def find_ldso_probe(exe: ElfImage) -> LdsoProbe | None:
    """Locate the calls to _dl_debug_state and _r_debug in the program's ld.so."""
    interp = exe.interpreter() or DEFAULT_LDSO
    try:  # the program's own ld.so: in its root when it is named through another one
        ldso = ElfImage(Path(beside(exe.path, interp)))
    except BinaryError:
        return None
    state = ldso.symbols.get("_dl_debug_state")
    rdebug = ldso.data_symbol("_r_debug")
    if not state or rdebug is None:
        return None
    calls = _cached_call_sites(ldso, state[0].vaddr) or [state[0].vaddr]
    sites = tuple((off, rdebug - vaddr) for vaddr in calls
                  if (off := ldso.vaddr_to_offset(vaddr)) is not None)
    return LdsoProbe(str(ldso.path), sites) if sites else None


def _cached_call_sites(ldso: ElfImage, target: int) -> list[int]:
    """Confirming call sites parses .eh_frame (0.1 s): kept per ld.so build-id (v2:
    tail jumps counted; a v1 file of trixie's ld.so holds no site)."""
    cache = CACHE_DIR / f"ldso-v2-{ldso.build_id}-{target:x}.json"
    if ldso.build_id:
        try:
            return [int(x) for x in json.loads(cache.read_text())]
        except (OSError, ValueError):
            pass
    calls = probepoint.call_sites(ldso, target, tail_calls=True)
    if ldso.build_id:
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(calls))
    return calls
