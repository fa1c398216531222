"""DWARF answers kept per binary, so a second check or attach does no DWARF work.

Keyed by build-id + spec + refcntd version (a rebuilt binary, an edited spec
or a new refcntd get a new entry).  An entry carries its key and a digest of
its contents and is checked on load: a file that does not match (stale,
truncated, corrupt, written by something else) is ignored and rebuilt, never
trusted.  Binaries without a build-id are not cached: nothing identifies them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from refcntd import __version__
from refcntd.binary import cpus, dwarfinfo
from refcntd.binary.elf import ElfImage
from refcntd.binary.forked import Forked
from refcntd.binary.hints import spec_key
from refcntd.inputs.spec import Spec
from refcntd.paths import CACHE_DIR, read_cache_json, write_cache_json

FORMAT = 2  # 2: an inlined copy nested in its own function is not a call site
FORK_SCAN_BYTES = 1 << 20  # of .debug_info: a smaller scan is not worth a fork


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass
class DwarfFacts:
    """DWARF answers for one binary and spec: loaded from the cache, or computed and saved."""

    image: ElfImage
    spec: Spec
    cache_dir: Path | None = None  # None: refcntd.paths.CACHE_DIR
    inlined: dict[str, dwarfinfo.InlinedScan] = field(default_factory=dict)
    clones: dict[str, dict[int, int] | None] = field(default_factory=dict)
    loaded: bool = False  # answers came from a valid cache entry
    dirty: bool = False  # something was computed that the entry lacks
    _scanning: Forked[dwarfinfo.InlinedScan] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.loaded = self._load()

    @property
    def key(self) -> dict[str, object] | None:
        if not self.image.build_id:
            return None
        return {"format": FORMAT, "build_id": self.image.build_id,
                "spec": spec_key(self.spec), "refcntd": __version__}

    @property
    def path(self) -> Path | None:
        key = self.key
        if key is None:
            return None
        name = f"{key['build_id']}-{key['spec']}-{__version__}.json"
        return (self.cache_dir or CACHE_DIR) / "analysis" / name

    def start_scan(self) -> None:
        """Begin the inlined-copy scan in a forked child (the call-site sweep runs
        meanwhile) when its answer is not cached, there is DWARF worth a CPU to scan,
        and a CPU for it."""
        if self._scan_key() in self.inlined or self._scanning is not None or \
                _debug_info_bytes(self.image) < FORK_SCAN_BYTES or cpus.free() < 2:
            return
        self._scanning = Forked(partial(dwarfinfo.inlined_copies, self.image,
                                        self._all_names()))

    def inlined_copies(self, names: set[str]) -> dwarfinfo.InlinedScan:
        """Of `names`; one scan serves every role of the spec (a scan costs a pass)."""
        k = self._scan_key()
        if k not in self.inlined:
            scan = self._scanning.result() if self._scanning is not None else None
            self._scanning = None
            if scan is None:  # no child, or it failed: scanned here
                scan = dwarfinfo.inlined_copies(self.image, self._all_names())
            self.inlined[k] = scan
            self.dirty = True
        scan = self.inlined[k]
        return replace(scan, copies=tuple(c for c in scan.copies if c.function in names))

    def finish(self) -> None:
        """Reap start_scan's child if nothing asked for its answer (the plan failed)."""
        if self._scanning is not None:
            self._scanning.result()
            self._scanning = None

    def _scan_key(self) -> str:
        return ",".join(sorted(self._all_names()))

    def _all_names(self) -> set[str]:
        return {f for role in self.spec.entries for f in role.functions}

    def clone_registers(self, vaddr: int, original: str) -> dict[int, int] | None:
        k = f"{vaddr:x} {original}"
        if k not in self.clones:
            self.clones[k] = dwarfinfo.clone_argument_registers(self.image, vaddr, original)
            self.dirty = True
        return self.clones[k]

    # ---- the file ----------------------------------------------------------------
    def save(self) -> None:
        """Write the entry atomically; a cache that cannot be written is only slower."""
        path = self.path
        if path is None or not self.dirty:
            return
        # An unfinished scan is not kept: the next run tries again.
        body = {"inlined": {k: _scan_json(s) for k, s in self.inlined.items() if s.complete},
                "clones": {k: None if r is None else {str(a): v for a, v in r.items()}
                           for k, r in self.clones.items()}}
        entry = {"key": self.key, "body": body, "digest": _digest(body)}
        write_cache_json(path, entry)
        self.dirty = False

    def _load(self) -> bool:
        path = self.path
        if path is None:
            return False
        try:
            entry = read_cache_json(path)  # None: TypeError below
            if entry["key"] != self.key or entry["digest"] != _digest(entry["body"]):
                return False
            inlined = {k: _scan_from(s) for k, s in entry["body"]["inlined"].items()}
            clones = {k: None if r is None else {int(a): int(v) for a, v in r.items()}
                      for k, r in entry["body"]["clones"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        self.inlined, self.clones = inlined, clones
        return True


def _debug_info_bytes(image: ElfImage) -> int:
    section = image.elffile().get_section_by_name(".debug_info")
    return int(section["sh_size"]) if section is not None else 0


def _scan_json(scan: dwarfinfo.InlinedScan) -> dict[str, object]:
    return {"copies": [[c.function, c.count, list(c.sites)] for c in scan.copies],
            "not_examined": list(scan.not_examined), "method": scan.method}


def _scan_from(data: dict[str, object]) -> dwarfinfo.InlinedScan:
    copies = tuple(dwarfinfo.InlinedCopies(str(f), int(n), tuple(str(s) for s in sites))
                   for f, n, sites in data["copies"])  # type: ignore[attr-defined]
    return dwarfinfo.InlinedScan(copies, tuple(str(u) for u in data["not_examined"]),  # type: ignore[attr-defined]
                                 str(data["method"]))


# ---- how many probes the last plan for a binary had -------------------------------
