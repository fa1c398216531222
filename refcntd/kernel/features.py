"""What the running kernel offers refcntd, probed from the kernel itself, once per build.

The code was written on Linux 6.18; Debian 12's own kernels (6.1, 6.12) lack some of
what it used (issue 40).  So the facts are read from the kernel that runs, not
assumed: tracepoint fields from tracefs, BTF, and what bpf() accepts, by tiny load
tests (a two-instruction program, a one-page map, a link on a directory that any
kernel refuses, each for its own reason).  The answers are kept per kernel build in
the cache (a few milliseconds saved, and `check` shows the same table `run` used).

This module only finds facts; kernel/program.py decides from them (`kernel_choices`):
which program variant to compile, how to attach, what to say, when to refuse.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import struct
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from refcntd.errors import EnvironmentProblem
from refcntd.kernel import bpfsys, pagemap, perf_uprobe, setup
from refcntd.kernel.btf import VMLINUX_BTF
from refcntd.paths import CACHE_DIR, write_cache_json

FORMAT = 2  # 2: soft_dirty, pagemap_scan
_INSN = struct.Struct("<BBhi")
_RETURN_0 = _INSN.pack(0xB7, 0, 0, 0) + _INSN.pack(0x95, 0, 0, 0)  # r0 = 0; exit
_CALL = 0x85
FUNC_GET_ATTACH_COOKIE = 174  # enum bpf_func_id, Linux 5.15
MAP_RINGBUF = 27  # BPF_MAP_TYPE_RINGBUF, Linux 5.8


@dataclass(frozen=True)
class Features:
    """Each fact about the running kernel: True, False, or None when it could not be
    probed here (bpf() needs privileges: `check` as a user)."""

    release: str
    group_dead: bool | None  # sched_process_exit has the group_dead field
    btf: bool | None  # /sys/kernel/btf/vmlinux
    uprobe_pmu: bool | None  # uprobes as perf events (/sys/bus/event_source/devices/uprobe)
    ringbuf: bool | None  # BPF_MAP_TYPE_RINGBUF
    attach_cookie: bool | None  # the bpf_get_attach_cookie helper
    uprobe_multi: bool | None  # BPF_TRACE_UPROBE_MULTI links
    soft_dirty: bool | None = None  # pages written since /proc/PID/clear_refs 4 are told
    #                                 (pagemap bit 55: CONFIG_MEM_SOFT_DIRTY)
    pagemap_scan: bool | None = None  # the PAGEMAP_SCAN ioctl with PAGE_IS_SOFT_DIRTY


WITHOUT = "REFCNTD_KERNEL_WITHOUT"  # features taken as missing: the fallbacks, on any kernel


@functools.cache
def current() -> Features:
    """The running kernel's features (from the cache when this build was probed), less
    those named in $REFCNTD_KERNEL_WITHOUT (comma-separated field names): the tests run
    each fallback on this kernel too, and a user can rule out a feature they distrust."""
    found = _cached()
    if found is None:
        found = probe()
        if None not in asdict(found).values():  # an unprivileged answer is not kept
            write_cache_json(_cache_path(), {"format": FORMAT, **asdict(found)})
    without = {name.strip() for name in os.environ.get(WITHOUT, "").split(",") if name.strip()}
    unknown = without - set(asdict(found)) - {"release"}
    if unknown:
        raise EnvironmentProblem(f"{WITHOUT}: no kernel feature {sorted(unknown)[0]}",
                                 f"name some of {', '.join(list(asdict(found))[1:])}")
    return Features(**{**asdict(found), **dict.fromkeys(without, False)})


def _cached() -> Features | None:
    try:
        data = json.loads(_cache_path().read_text())
        if data.pop("format", None) == FORMAT:
            return Features(**data)
    except (OSError, ValueError, TypeError):
        pass
    return None


def _cache_path(cache: Path = CACHE_DIR) -> Path:
    """Keyed by the kernel build (release and version string: a rebuild changes it)."""
    uname = os.uname()
    digest = hashlib.sha256(f"{uname.release}\n{uname.version}".encode()).hexdigest()[:24]
    return cache / "features" / f"{digest}.json"


def probe(tracefs: Path | None = None) -> Features:
    """Ask the kernel (no cache)."""
    tracefs = tracefs or setup.mounted_tracefs()
    return Features(os.uname().release, _tracepoint_field(tracefs, "sched", "sched_process_exit",
                                                           "group_dead"),
                    VMLINUX_BTF.is_file(), (perf_uprobe.UPROBE_PMU / "type").is_file(),
                    _ringbuf(), _helper(FUNC_GET_ATTACH_COOKIE), _uprobe_multi(),
                    _soft_dirty(), pagemap.scan_works())


def _tracepoint_field(tracefs: Path | None, category: str, event: str, field: str
                      ) -> bool | None:
    """bcc builds a tracepoint's struct from this format file: a field it lacks is a
    compile error (`no member named 'group_dead'`)."""
    if tracefs is None:
        return None
    try:
        text = (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None
    return any(line.strip().startswith("field:") and
               line.split(";")[0].split()[-1] == field for line in text.splitlines())


def _privileged(answer: OSError) -> bool | None:
    """A refusal that says nothing about the feature (no privileges) is None."""
    return None if answer.errno in (errno.EPERM, errno.EACCES) else False


def _ringbuf() -> bool | None:
    try:
        os.close(bpfsys.create_map("refcntd_probe", MAP_RINGBUF, 0, 0, os.sysconf("SC_PAGE_SIZE"),
                                   0))
    except OSError as err:
        return _privileged(err)
    return True


def _load(name: str, code: bytes, attach_type: int = -1) -> int:
    return bpfsys.load_program(name, bpfsys.PROG_KPROBE, code, attach_type)


def _helper(func_id: int) -> bool | None:
    """The verifier refuses a call to a helper it does not know ("invalid func")."""
    try:
        os.close(_load("refcntd_probe", _INSN.pack(_CALL, 0, 0, func_id) + _RETURN_0))
    except OSError as err:
        return _privileged(err)
    return True


def _uprobe_multi() -> bool | None:
    """A multi-uprobe link on "/" (a directory): a kernel with such links refuses it with
    EBADF (not a regular file), one without them with EINVAL (unknown attach type)."""
    try:
        prog = _load("refcntd_probe", _RETURN_0, perf_uprobe.BPF_TRACE_UPROBE_MULTI)
    except OSError as err:
        return _privileged(err)
    try:
        os.close(perf_uprobe.link_uprobe_multi(prog, "/", [0], [0]))
        return True  # not expected: a link on a directory; supported all the same
    except OSError as err:
        return err.errno in (errno.EBADF, errno.ENOENT) or _privileged(err)
    finally:
        os.close(prog)


# Run in a child (clear_refs is per address space: this process's pages would all be
# write-protected): a page written after clear_refs 4 must read soft-dirty in pagemap,
# and not before.  A kernel without CONFIG_MEM_SOFT_DIRTY accepts the 4 and never sets
# the bit (Linux 6.18 here), so only the written page tells.
_SOFT_DIRTY_TEST = """
import ctypes, mmap, struct
area = mmap.mmap(-1, mmap.PAGESIZE)
area[0] = 1
page = ctypes.addressof(ctypes.c_char.from_buffer(area)) // mmap.PAGESIZE
def dirty():
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(page * 8)
        return struct.unpack("<Q", f.read(8))[0] >> 55 & 1
with open("/proc/self/clear_refs", "w") as f:
    f.write("4")
clean = dirty()
area[0] = 2
print(int(clean == 0 and dirty() == 1))
"""


def _soft_dirty() -> bool | None:
    try:
        answer = subprocess.run([sys.executable, "-I", "-S", "-c", _SOFT_DIRTY_TEST],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout.strip() == "1"
