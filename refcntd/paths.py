"""Where refcntd's own files live, in a checkout and in an installed wheel.

The wheel carries `bpf/` and `configs/` as `refcntd/_data/{bpf,configs}`
(see pyproject.toml); a checkout has them at the top level.  Every stage
asks here, so neither layout is assumed anywhere else.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

CACHE_DIR = Path(os.environ.get("REFCNTD_CACHE", "/var/cache/refcntd"))
RUN_DIR = Path(os.environ.get("REFCNTD_RUN_DIR", "/run/refcntd"))  # gone at reboot


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
    """Replace a cache file atomically (readers see the old or the new one, never half);
    False when it cannot be written: a cache that cannot be written is only slower."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
        return True
    return False
