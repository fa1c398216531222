"""Uprobes (and tracepoints) opened directly as perf events, linked to a BPF program.

We do not use bcc's attach_uprobe: bcc 0.26's Python binding passes a
garbage ref_ctr_offset (bcc issue 5236), which makes the kernel write into
the target's memory and blocks correct USDT probes on the same site.  Here
ref_ctr_offset is always what we mean (0 for function probes), and the BPF
link carries a cookie: the probe's index in the probe_cfgs map.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from refcntd.kernel import bpfsys
from refcntd.kernel.procfds import fd_kinds

NR_PERF_EVENT_OPEN = 298
PERF_TYPE_TRACEPOINT = 2
BPF_PERF_EVENT = 41
BPF_TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type, Linux 6.6+
BPF_F_UPROBE_MULTI_RETURN = 1
PERF_FLAG_FD_CLOEXEC = 8
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")

_libc = ctypes.CDLL(None, use_errno=True)


class _PerfEventAttr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64),
                ("config2", ctypes.c_uint64)]


class _LinkCreateAttr(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("bpf_cookie", ctypes.c_uint64), ("reserved", ctypes.c_uint8 * 48)]


class _UprobeMultiAttr(ctypes.Structure):
    """union bpf_attr.link_create with its uprobe_multi member (include/uapi/linux/bpf.h)."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("path", ctypes.c_uint64), ("offsets", ctypes.c_uint64),
                ("ref_ctr_offsets", ctypes.c_uint64), ("cookies", ctypes.c_uint64),
                ("cnt", ctypes.c_uint32), ("multi_flags", ctypes.c_uint32),
                ("pid", ctypes.c_uint32), ("reserved", ctypes.c_uint8 * 28)]


@dataclass(frozen=True)
class MultiRefusal:
    """A multi-uprobe link the kernel refused: its sites were retried one link per site."""

    module: str
    retprobe: bool
    sites: int
    errno: int
    message: str


class UprobeError(OSError):
    """perf_event_open or BPF_LINK_CREATE failed; errno explains why."""


def uprobe_pmu_type() -> int:
    try:
        return int((UPROBE_PMU / "type").read_text())
    except OSError as err:
        raise UprobeError(err.errno or errno.ENOENT,
                          "the kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS off?)") from None


def open_uprobe(path: str, file_offset: int, retprobe: bool = False,
                ref_ctr_offset: int = 0, pid: int = -1) -> int:
    """A perf event fd for a uprobe at `file_offset` of `path` (pid -1: every process)."""
    attr = _PerfEventAttr()
    attr.type = uprobe_pmu_type()
    attr.size = ctypes.sizeof(attr)
    encoded = ctypes.create_string_buffer(os.fsencode(path))
    attr.config1 = ctypes.addressof(encoded)
    attr.config2 = file_offset
    attr.config = (1 if retprobe else 0) | (ref_ctr_offset << 32)
    cpu = 0 if pid == -1 else -1
    fd: int = _libc.syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), pid, cpu, -1,
                       PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise UprobeError(err, explain_errno(err))
    return fd


def open_tracepoint(tracefs: Path, category: str, event: str) -> int:
    """A perf event fd for a kernel tracepoint, on every CPU and process."""
    try:
        tp_id = int((tracefs / "events" / category / event / "id").read_text())
    except (OSError, ValueError) as err:
        raise UprobeError(errno.ENOENT, f"no tracepoint {category}:{event} under "
                                        f"{tracefs}: {err}") from None
    attr = _PerfEventAttr(type=PERF_TYPE_TRACEPOINT, config=tp_id, sample_period=1,
                          wakeup_events=1)
    attr.size = ctypes.sizeof(attr)
    fd: int = _libc.syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, 0, -1,
                            PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise UprobeError(code, f"tracepoint {category}:{event}: {explain_errno(code)}")
    return fd


def link_bpf(prog_fd: int, perf_fd: int, cookie: int) -> int:
    """Attach a loaded BPF program to a perf event with a cookie; returns the link fd."""
    attr = _LinkCreateAttr(prog_fd=prog_fd, target_fd=perf_fd, attach_type=BPF_PERF_EVENT,
                           bpf_cookie=cookie)
    try:
        return bpfsys.call(bpfsys.LINK_CREATE, attr)
    except OSError as err:
        raise UprobeError(err.errno, explain_errno(err.errno or 0)) from None


def link_uprobe_multi(prog_fd: int, path: str, offsets: list[int], cookies: list[int],
                      retprobe: bool = False, ref_ctr_offsets: list[int] | None = None
                      ) -> int:
    """One BPF link for many uprobes in one file (BPF_TRACE_UPROBE_MULTI).

    Per-site perf events cost a perf_event_open and a link each; this is one
    syscall for thousands of call sites.  `prog_fd` must have been loaded
    with expected_attach_type BPF_TRACE_UPROBE_MULTI.  `ref_ctr_offsets`:
    USDT semaphores (file offsets, 0 for none), one per site.
    """
    n = len(offsets)
    encoded = ctypes.create_string_buffer(os.fsencode(path))
    offs = (ctypes.c_uint64 * n)(*offsets)
    cooks = (ctypes.c_uint64 * n)(*cookies)
    semaphores = ref_ctr_offsets or []
    refs = (ctypes.c_uint64 * n)(*semaphores) if any(semaphores) else None
    attr = _UprobeMultiAttr(prog_fd=prog_fd, attach_type=BPF_TRACE_UPROBE_MULTI,
                            path=ctypes.addressof(encoded), offsets=ctypes.addressof(offs),
                            cookies=ctypes.addressof(cooks), cnt=n,
                            ref_ctr_offsets=ctypes.addressof(refs) if refs else 0,
                            multi_flags=BPF_F_UPROBE_MULTI_RETURN if retprobe else 0)
    try:
        return bpfsys.call(bpfsys.LINK_CREATE, attr)
    except OSError as err:
        code = err.errno or 0
        raise UprobeError(code, MULTI_EINVAL if code == errno.EINVAL
                          else explain_errno(code)) from None


MULTI_EINVAL = ("invalid argument (EINVAL): a program not loaded for BPF_TRACE_UPROBE_MULTI "
                "(or sharing a prog array with one that is not), or a site with another "
                "USDT semaphore offset")


def held_fds(pid: int | str = "self") -> dict[str, int]:
    """BPF links and perf events a process holds (/proc/PID/fd): what detach must close."""
    kinds = fd_kinds(pid)
    return {kind: kinds.get(f"anon_inode:{kind}", 0) for kind in ("bpf_link", "[perf_event]")}


ENOTSUPP = 524  # the kernel's own "not supported" (include/linux/errno.h), not in errno


def explain_errno(err: int) -> str:
    if err == ENOTSUPP:
        return ("the kernel refused the instruction at this address (ENOTSUPP): "
                "x86 uprobes cannot sit on lock- or segment-prefixed instructions")
    if err in (errno.EPERM, errno.EACCES):
        return "permission denied: needs root or CAP_PERFMON + CAP_BPF"
    if err == errno.EINVAL:
        return ("invalid argument (EINVAL): another probe on this address may use a different "
                "USDT semaphore offset")
    if err == errno.ENOENT:
        return "no such file"
    return os.strerror(err)
