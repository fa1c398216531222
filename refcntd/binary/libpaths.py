"""Where a library is: a spec's `library:` or a DT_NEEDED soname, found the way ld.so
would (LD_LIBRARY_PATH, the program's RUNPATH, ld.so's cache, the default
directories)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from refcntd.binary.elf import ElfImage
from refcntd.errors import BinaryError
from refcntd.inputs.rootpaths import beside, resolve, seen_inside, split_root


def resolve_library(name: str, exe: ElfImage | None) -> str:
    """A spec's `library:` as a path: absolute, or a soname found the way ld.so would.
    For a program named through another root (/proc/PID/root/...), both are looked for
    in that root, as its processes' ld.so does."""
    like = str(exe.path) if exe is not None else "/"
    if "/" in name:
        path = beside(like, name)
        if not Path(path).exists():
            raise BinaryError(f"library {name} (named in the spec) does not exist")
        return path
    for directory in _library_dirs(exe):
        candidate = beside(like, os.path.join(directory, name))
        if Path(candidate).exists():
            return candidate
    raise BinaryError(f"library {name} (named in the spec) not found",
                      "give its path in the spec, or set LD_LIBRARY_PATH")


def resolve_spec_library(name: str, binary: ElfImage) -> str:
    """A spec's `library:` for tracing `binary`: a bare name equal to the traced file's
    own name or soname is that file (`spec draft` then `attach --binary ./libfoo.so`
    traces the library that was read, not one that ld.so would find elsewhere)."""
    if "/" not in name and name in (binary.path.name, binary.soname()):
        return resolve(binary.path)
    return resolve_library(name, binary)


def _library_dirs(exe: ElfImage | None) -> list[str]:
    """Directories as `exe`'s processes name them (inside its root); LD_LIBRARY_PATH is
    refcntd's own, so only for a program of refcntd's root."""
    root = split_root(exe.path)[0] if exe is not None else ""
    dirs = [] if root else [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if exe is not None:
        origin = seen_inside(os.path.dirname(resolve(exe.path)))
        dirs += [d.replace("$ORIGIN", origin) for d in exe.runpaths()]
    dirs += _ldconfig_dirs(root) + ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                                "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]
    return dirs


def _ldconfig_dirs(root: str = "") -> list[str]:
    """The directories of ld.so's cache (of `root`: /proc/PID/root, or "" for ours), read
    once per version of its /etc/ld.so.cache (a program's load set resolves dozens of
    sonames; `ldconfig -p` is a process each)."""
    cache = root + LD_SO_CACHE
    try:
        stamp = os.stat(cache).st_mtime_ns
    except OSError:
        stamp = 0
    dirs = _LDCONFIG.get((cache, stamp))
    if dirs is None:  # (a local: serve's threads may plan at once)
        dirs = _run_ldconfig(cache)
        for old in [k for k in _LDCONFIG if k[0] == cache]:
            _LDCONFIG.pop(old, None)
        _LDCONFIG[(cache, stamp)] = dirs
    return list(dirs)


LD_SO_CACHE = "/etc/ld.so.cache"
_LDCONFIG: dict[tuple[str, int], list[str]] = {}  # (cache file, its mtime) -> its directories


def _run_ldconfig(cache: str = LD_SO_CACHE) -> list[str]:
    """The directories `ldconfig -p` lists from `cache` (another root's: the same format)."""
    try:
        out = subprocess.run(["ldconfig", "-p", "-C", cache], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({str(Path(line.rsplit("=> ", 1)[1]).parent) for line in out.splitlines()
                   if "=> " in line})
