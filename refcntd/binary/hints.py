"""What the last plan for a file and spec looked like (its probe count, whether it held
processes): the BPF compile starts from this before the analysis (cli/early.py), so
this module stays light (no ELF or DWARF readers)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from refcntd.inputs import rootpaths
from refcntd.inputs.spec import Spec
from refcntd.paths import CACHE_DIR, read_cache_json, write_cache_json


def spec_key(spec: Spec) -> str:
    """What of the spec the analysis depends on: its roles, whatever file they came from."""
    return hashlib.sha256(repr(sorted(spec.roles.items())).encode()).hexdigest()[:16]


_HINTS = "probe-counts.json"
_HINTS_KEPT = 512


def _hint_key(binary: str, spec: Spec) -> str | None:
    try:
        st = os.stat(binary)
    except OSError:
        return None
    return f"{rootpaths.resolve(binary)}|{st.st_size}|{st.st_mtime_ns}|{spec_key(spec)}"


def _hints(cache_dir: Path | None) -> dict[str, list[int | bool]]:
    """key -> [probe count, hold]; an older file's bare counts read as [count, False]."""
    try:
        data = read_cache_json((cache_dir or CACHE_DIR) / "analysis" / _HINTS)
        return {str(k): [int(v), False] if isinstance(v, int) else [int(v[0]), bool(v[1])]
                for k, v in data.items()}
    except (OSError, ValueError, TypeError, AttributeError, IndexError, KeyError):
        return {}


def probe_count_hint(binary: str, spec: Spec, cache_dir: Path | None = None
                     ) -> tuple[int, bool]:
    """The probe count of the last plan for this file and spec (0 if unknown), and
    whether it held processes for modules mapped later (exported call-site mode).

    The BPF program's maps are made before the analysis, with room for a guessed
    number of probes; call-site mode can need thousands.  A wrong hint costs
    making the maps again (their sizes are derived from the cached layout)."""
    key = _hint_key(binary, spec)
    value = _hints(cache_dir).get(key) if key else None
    return (int(value[0]), bool(value[1])) if value else (0, False)


def remember_probe_count(binary: str, spec: Spec, count: int, hold: bool = False,
                         cache_dir: Path | None = None) -> None:
    key = _hint_key(binary, spec)
    hints = _hints(cache_dir)
    if key is None or hints.get(key) == [count, hold]:
        return
    hints.pop(key, None)
    hints[key] = [count, hold]  # the newest last: the oldest are dropped first
    kept = dict(list(hints.items())[-_HINTS_KEPT:])
    write_cache_json((cache_dir or CACHE_DIR) / "analysis" / _HINTS, kept)
