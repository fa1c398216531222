"""Where refcntd's own files live, in a checkout and in an installed wheel.

The wheel carries `bpf/` and `configs/` as `refcntd/_data/{bpf,configs}`
(see pyproject.toml); a checkout has them at the top level.  Every stage
asks here, so neither layout is assumed anywhere else.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent

DEFAULT_CACHE_DIR = Path("/var/cache/refcntd")
DEFAULT_RUN_DIR = Path("/run/refcntd")  # gone at reboot


def untrusted_reason(path: Path) -> str | None:
    """Why another user could change what `path` holds, or None: the directory (or, if
    it does not exist yet, the one it will be made in) and each one above it must be
    owned by root or this user and not writable by others (OpenSSH's StrictModes)."""
    from refcntd.inputs.safefs import trusted_dir
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    if existing != path and os.lstat(existing).st_mode & 0o022:
        return f"{path} does not exist and {existing} is writable by others"
    return trusted_dir(existing)


def trusted_or_default(env: str, default: Path, what: str) -> Path:
    """$`env` when only root could have put anything there; else, with one line saying
    so, the default (or a fresh private directory): caches hold code refcntd loads into
    the kernel and offsets where it plants breakpoints in every process."""
    chosen = Path(os.environ.get(env, str(default)))
    why = untrusted_reason(chosen)
    if why is None:
        return chosen
    fallback = default if chosen != default and untrusted_reason(default) is None else \
        Path(tempfile.mkdtemp(prefix=f"refcntd-{what}-"))
    print(f"refcntd: warning: {what} directory {chosen} not used: {why} (make it owned by "
          f"root and not writable by group or others, or set {env}); using {fallback}",
          file=sys.stderr)
    return fallback


CACHE_DIR = trusted_or_default("REFCNTD_CACHE", DEFAULT_CACHE_DIR, "cache")
RUN_DIR = trusted_or_default("REFCNTD_RUN_DIR", DEFAULT_RUN_DIR, "run")


def data_dir(name: str) -> Path:
    """`bpf` or `configs`: the installed copy if there is one, else the checkout's."""
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


BPF_DIR = data_dir("bpf")
CONFIGS_DIR = data_dir("configs")
SPEC_DIR = CONFIGS_DIR / "specs"


def write_cache_json(path: Path, data: object) -> bool:
    """Replace a cache file atomically (readers see the old or the new one, never half;
    a link at `path` is replaced, not followed); False when it cannot be written: a
    cache that cannot be written is only slower."""
    from refcntd.inputs.safefs import atomic_write
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data).encode())
        return True
    return False


def read_cache(path: Path, limit: int = 1 << 30) -> bytes | None:
    """A cache entry's bytes, or None: opened without following a link, regular files
    only, never waiting on a FIFO."""
    from refcntd.inputs.safefs import UntrustedFileError, open_untrusted
    try:
        with open_untrusted(path, limit, what="cache entry") as entry:
            return entry.read_all()
    except UntrustedFileError:
        return None


def read_cache_json(path: Path) -> Any:
    """A JSON cache entry, or None (missing, refused or not JSON: recomputed)."""
    data = read_cache(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None
