"""The one step that prepares this machine for tracing, and its read-only twin.

Constructing a Kernel changes nothing outside it; what tracing needs from the
system (privileges, a mounted tracefs, kernel headers for bcc's compile and
BCC_KERNEL_SOURCE pointing at them) is chosen here, once, by `prepare()`,
which run, attach and serve call before building a Kernel.  `describe()`
answers the same questions without mounting, building or setting anything,
so `refcntd check` can show them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from refcntd.errors import EnvironmentProblem
from refcntd.kernel.kheaders import choose_headers

CAP_PERFMON, CAP_BPF, CAP_SYS_ADMIN = 38, 39, 21
TRACEFS = Path("/sys/kernel/tracing")
TRACEFS_PLACES = (TRACEFS, Path("/sys/kernel/debug/tracing"))


@dataclass(frozen=True)
class TracingEnvironment:
    """What tracing uses on this machine: each field is a fact, or why it is missing."""

    privileges: str  # "root", "CAP_SYS_ADMIN", "CAP_BPF and CAP_PERFMON"; "" when too few
    tracefs: Path | None  # where tracefs is mounted; None: not mounted
    tracefs_mounted_here: bool  # prepare() mounted it
    kernel_headers: Path | None  # what BCC_KERNEL_SOURCE is (or would be) set to
    headers_problem: str = ""  # why kernel_headers is None
    headers_why: str = ""  # which headers these are and why (kheaders.Headers.why)
    headers_exact: bool = True  # the running kernel's own (or the user's choice)
    tracefs_unreadable: Path | None = None  # a place this user may not look into

    def lines(self) -> list[str]:
        """For `refcntd check`: one line per fact."""
        tracefs = (f"mounted at {self.tracefs}" if self.tracefs else
                   f"not readable as this user ({self.tracefs_unreadable}; tracing runs as "
                   "root)" if self.tracefs_unreadable else
                   f"not mounted (tracing would mount it at {TRACEFS})")
        headers = (f"{self.kernel_headers} ({self.headers_why})" if self.kernel_headers
                   else f"none: {self.headers_problem}")
        held = self.privileges or "insufficient: needs root, or CAP_BPF and CAP_PERFMON"
        return [f"privileges: {held}", f"tracefs: {tracefs}",
                f"kernel headers (BCC_KERNEL_SOURCE): {headers}"]


def describe() -> TracingEnvironment:
    """What prepare() would use, changing nothing (no mount, no header tree, no env)."""
    try:
        chosen = choose_headers(create=False)
    except EnvironmentProblem as err:
        chosen, problem = None, err.message
    tracefs = mounted_tracefs()
    unreadable = None if tracefs else unreadable_tracefs()
    if chosen is None:
        return TracingEnvironment(privileges(), tracefs, False, None, problem,
                                  tracefs_unreadable=unreadable)
    return TracingEnvironment(privileges(), tracefs, False, chosen.path, "", chosen.why,
                              chosen.exact, unreadable)


PROC_PID_INIT_INO = 0xEFFFFFFC  # the initial PID namespace's inode, fixed by the kernel


def require_host_pids(ns: str = "/proc/self/ns/pid") -> None:
    """BPF sees every process by its PID in the initial namespace; refcntd, in a
    container of its own PID namespace, knows its children by others: it would trace
    nothing and report a clean run (seen: `podman run` without --pid=host)."""
    try:
        inode = os.stat(ns).st_ino
    except OSError:
        return  # no /proc/self/ns: nothing to compare; the kernel is older than 3.8
    if inode != PROC_PID_INIT_INO:
        raise EnvironmentProblem(
            "refcntd runs in a PID namespace of its own (a container): the kernel "
            "reports the host's PIDs, so no process would be matched",
            "run the container with the host's PID namespace (podman/docker --pid=host, "
            "Kubernetes hostPID: true)")


def prepare() -> TracingEnvironment:
    """Check privileges, mount tracefs if needed, refuse a kernel lacking a feature with
    no fallback, choose kernel headers and export them."""
    held = privileges()
    if not held:
        raise EnvironmentProblem("tracing needs root, or CAP_BPF and CAP_PERFMON",
                                 "run as root, e.g. with sudo")
    tracefs, mounted = mounted_tracefs(), False
    if tracefs is None:
        tracefs, mounted = _mount_tracefs(), True
    from refcntd.kernel.program import kernel_choices  # program -> features -> this module
    kernel_choices().require()  # a kernel feature with no fallback: before any other work
    chosen = choose_headers()
    os.environ["BCC_KERNEL_SOURCE"] = str(chosen.path)
    return TracingEnvironment(held, tracefs, mounted, chosen.path, "", chosen.why, chosen.exact)


def privileges() -> str:
    """The privilege that allows tracing, or '' when the process lacks it."""
    if os.geteuid() == 0:
        return "root"
    caps = _effective_caps()
    if caps >> CAP_SYS_ADMIN & 1:
        return "CAP_SYS_ADMIN"
    if caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1:
        return "CAP_BPF and CAP_PERFMON"
    return ""


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def mounted_tracefs() -> Path | None:
    """bcc finds tracepoints through tracefs, at one of the places systems use.  A
    place this user may not enter (root's 0700 /sys/kernel/tracing, for `check` run
    by another user) is not found."""
    for place in TRACEFS_PLACES:
        with contextlib.suppress(PermissionError):
            if (place / "events").is_dir():
                return place
    return None


def unreadable_tracefs() -> Path | None:
    """The first place of tracefs this user may not look into, if one is."""
    for place in TRACEFS_PLACES:
        try:
            (place / "events").is_dir()
        except PermissionError:
            return place
    return None


def _mount_tracefs() -> Path:
    done = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)],
                          capture_output=True, check=False)
    if done.returncode != 0 or not (TRACEFS / "events").is_dir():
        raise EnvironmentProblem(f"tracefs is not mounted at {TRACEFS} and mounting it failed",
                                 f"mount -t tracefs nodev {TRACEFS}")
    return TRACEFS
