"""Where refcntd's own files live, in a checkout and in an installed wheel.

The wheel carries `bpf/` and `configs/` as `refcntd/_data/{bpf,configs}`
(see pyproject.toml); a checkout has them at the top level.  Every stage
asks here, so neither layout is assumed anywhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

CACHE_DIR = Path(os.environ.get("REFCNTD_CACHE", "/var/cache/refcntd"))


def data_dir(name: str) -> Path:
    """`bpf` or `configs`: the installed copy if there is one, else the checkout's."""
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    return _PACKAGE.parent / name


BPF_DIR = data_dir("bpf")
CONFIGS_DIR = data_dir("configs")
SPEC_DIR = CONFIGS_DIR / "specs"
