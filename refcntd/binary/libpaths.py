"""Where a library is: a spec's `library:` or a DT_NEEDED soname, found the way ld.so
would (LD_LIBRARY_PATH, the program's RUNPATH, ld.so's cache, the default
directories)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError


def resolve_library(name: str, exe: ElfImage | None) -> str:
    """A spec's `library:` as a path: absolute, or a soname found the way ld.so would."""
    if "/" in name:
        if not Path(name).exists():
            raise BinaryError(f"library {name} (named in the spec) does not exist")
        return str(Path(name).resolve())
    for directory in _library_dirs(exe):
        candidate = Path(directory) / name
        if candidate.exists():
            return str(candidate.resolve())
    raise BinaryError(f"library {name} (named in the spec) not found",
                      "give its path in the spec, or set LD_LIBRARY_PATH")


def resolve_spec_library(name: str, binary: ElfImage) -> str:
    """A spec's `library:` for tracing `binary`: a bare name equal to the traced file's
    own name or soname is that file (`spec draft` then `attach --binary ./libfoo.so`
    traces the library that was read, not one that ld.so would find elsewhere)."""
    if "/" not in name and name in (binary.path.name, binary.soname()):
        return str(binary.path.resolve())
    return resolve_library(name, binary)


def _library_dirs(exe: ElfImage | None) -> list[str]:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if exe is not None:
        origin = str(exe.path.resolve().parent)
        dirs += [d.replace("$ORIGIN", origin) for d in exe.runpaths()]
    dirs += _ldconfig_dirs() + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                                "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]
    return dirs


def _ldconfig_dirs() -> list[str]:
    """The directories of ld.so's cache, read once per version of /etc/ld.so.cache (a
    program's load set resolves dozens of sonames; `ldconfig -p` is a process each)."""
    try:
        stamp = os.stat(LD_SO_CACHE).st_mtime_ns
    except OSError:
        stamp = 0
    dirs = _LDCONFIG.get(stamp)
    if dirs is None:  # (a local: serve's threads may plan at once)
        dirs = _run_ldconfig()
        _LDCONFIG.clear()
        _LDCONFIG[stamp] = dirs
    return list(dirs)


LD_SO_CACHE = "/etc/ld.so.cache"
_LDCONFIG: dict[int, list[str]] = {}  # the cache's mtime -> its directories


def _run_ldconfig() -> list[str]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({str(Path(line.rsplit("=> ", 1)[1]).parent) for line in out.splitlines()
                   if "=> " in line})
