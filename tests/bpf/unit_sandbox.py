"""The shipped unit's confinement, applied outside systemd (none runs here): its
capability bounding set and NoNewPrivileges through setpriv, in a session of its own,
and its SystemCallFilter= as the same seccomp filter systemd would install (groups
expanded by `systemd-analyze syscall-filter`, loaded by libseccomp's Python binding)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "refcntd.service"


def settings(name: str) -> list[str]:
    """Every value of `name=` in the unit, in order (a setting may be given twice)."""
    prefix = f"{name}="
    return [line[len(prefix):] for line in UNIT.read_text().splitlines()
            if line.startswith(prefix)]


def unit_caps() -> list[str]:
    """CapabilityBoundingSet= of the shipped unit, as setpriv names them."""
    (line,) = settings("CapabilityBoundingSet")
    return [c.removeprefix("CAP_").lower() for c in line.split()]


@functools.cache
def expand(group: str) -> frozenset[str]:
    """A syscall, or every syscall of a @group and of the groups it holds."""
    if not group.startswith("@"):
        return frozenset({group})
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    names: set[str] = set()
    for line in out[1:]:
        word = line.strip()
        if word and not word.startswith("#"):
            names |= expand(word)
    return frozenset(names)


def allowed_syscalls() -> list[str]:
    """systemd's reading of SystemCallFilter=: an allow list, less the ~ lists after it."""
    allowed: set[str] = set()
    for value in settings("SystemCallFilter"):
        deny = value.startswith("~")
        names = set().union(*(expand(w) for w in value.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return sorted(allowed)


def confined(caps: list[str] | None = None, seccomp: bool = True) -> list[str]:
    """A command prefix: a new session with the unit's capabilities (or `caps`) and
    NoNewPrivileges, then its system call filter."""
    caps = unit_caps() if caps is None else caps
    listed = ",".join(f"+{c}" for c in caps)
    prefix = ["setsid", "setpriv", "--no-new-privs", f"--bounding-set=-all,{listed}",
              f"--inh-caps=-all,{listed}", f"--ambient-caps=-all,{listed}"]
    if not seccomp:
        return prefix
    (errno_name,) = settings("SystemCallErrorNumber")
    return [*prefix, "/usr/bin/python3", str(Path(__file__).with_name("seccomp_exec.py")),
            errno_name, ",".join(allowed_syscalls()), "--"]


if __name__ == "__main__":  # print the filter, for a look by hand
    print(" ".join(allowed_syscalls()), file=sys.stdout)
