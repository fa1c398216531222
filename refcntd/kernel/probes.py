"""The plan's probes in the kernel: their configuration rows (probe_cfgs), their
attachment (multi-uprobe links, or one perf event each), the probes added or
disabled while tracing, and how often each fired."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from refcntd.kernel import abi, bpfsys, decode, perf_uprobe
from refcntd.kernel.abi import Role
from refcntd.kernel.maps import update_array
from refcntd.kernel.parts import TypeIds
from refcntd.kernel.perf_uprobe import MultiRefusal
from refcntd.kernel.program import Program
from refcntd.kernel.records import STAGE_LINK, STAGE_MULTI, STAGE_OPEN, ProbeFailure

if TYPE_CHECKING:  # attach's start imports this module: not the binary analysis with it
    from refcntd.binary.probesite import ProbeSite

U64_MASK = (1 << 64) - 1  # a BPF cookie is a u64: negative deltas go in two's complement


def attach_type(multi: bool) -> int:
    """The expected_attach_type of every program attached to a probe: the kernel links a
    multi-typed program to nothing but a multi-uprobe link."""
    return perf_uprobe.BPF_TRACE_UPROBE_MULTI if multi else -1


class BpfProbes:
    """Probes of `sites` running `prog` (on_probe's fd); close() detaches them all."""

    def __init__(self, program: Program, sites: list[ProbeSite], prog: int, multi: bool
                 ) -> None:
        """`multi`: attach through BPF_TRACE_UPROBE_MULTI links; False: one perf event
        per site."""
        self.program, self.sites, self.multi = program, sites, multi
        self._prog = prog
        self._links: list[int] = []
        self._perf_fds: list[int] = []
        self.multi_links = 0  # how many multi-uprobe links attach_all made
        self.multi_sites = 0  # how many sites they carry
        self.ldso_links = 0  # ld.so's _dl_debug_state call sites, one multi link
        self.multi_refused: list[MultiRefusal] = []  # groups that fell back, and why
        self.failed_probes: list[ProbeFailure] = []

    @property
    def capacity(self) -> int:
        """probe_cfgs' size as compiled (MAX_PROBES)."""
        return int(self.program["probe_cfgs"].max_entries)

    def configure(self, type_ids: TypeIds, packed: bytes | None = None) -> None:
        """One entry per site, written in one batch (call-site plans have thousands);
        `packed`: pack_probe_cfgs' rows, built while the compile was still running."""
        if self.sites:
            rows = packed if packed is not None else decode.pack_probe_cfgs(self.sites, type_ids)
            update_array(self.program["probe_cfgs"], 0, abi.ProbeCfg, rows)

    def attach_all(self) -> None:
        """Install every planned probe; a failure is recorded, not hidden.

        Multi mode: all probes of one file (function, call-site and USDT probes with
        their semaphores) share one multi-uprobe link per direction: one syscall for
        thousands of sites, and one fd to close at detach.  A group the kernel
        refuses is retried one site per link, so the refused site is named, and
        `multi_refused` says why.  Otherwise one perf event and link per site.
        """
        self._attach(range(len(self.sites)))

    def add_sites(self, sites: list[ProbeSite], type_ids: TypeIds) -> list[int]:
        """Configure and attach probes planned after start (a module mapped later);
        their indexes, or [] when the spare slots are used up (nothing attached)."""
        first = len(self.sites)
        if not sites or first + len(sites) > self.capacity:
            return []
        self.sites.extend(sites)  # the plan's list: statuses follow
        update_array(self.program["probe_cfgs"], first, abi.ProbeCfg,
                     decode.pack_probe_cfgs(sites, type_ids))
        indexes = list(range(first, first + len(sites)))
        self._attach(indexes)
        return indexes

    def disable_sites(self, indexes: list[int]) -> None:
        """Probes that must count nothing any more (their function went back to its
        entry probe): their configuration says so; the uprobes stay until detach."""
        table = self.program["probe_cfgs"]
        for index in indexes:
            cfg = table[ctypes.c_int(index)]
            cfg.role = Role.OFF.value
            table[ctypes.c_int(index)] = cfg

    def attach_ldso(self, path: str, sites: tuple[tuple[int, int], ...]) -> str | None:
        """Probe ld.so's calls to _dl_debug_state; returns why not, if it could not."""
        cookies = [delta & U64_MASK for _, delta in sites]
        why = self._attach_helper("on_ldso", path, [offset for offset, _ in sites], cookies)
        if why is None and self.multi:
            self.ldso_links += 1
        return why

    def attach_dlsym(self, path: str, offsets: list[int]) -> str | None:
        """Probes on the `ret` instructions of dlsym/dlvsym (file offsets in `path`), not
        return probes (see Vetting._probe_dlsym); why not, if not."""
        return self._attach_helper("on_dlsym_return", path, offsets, [0] * len(offsets))

    def attach_exit_hold(self, path: str, offsets: list[int]) -> str | None:
        """Probes on libc's _exit (file offsets in `path`) stopping a traced process for
        its exit scan (bpf/exithold.h); why not, if not."""
        return self._attach_helper("on_exit_hold", path, offsets, [0] * len(offsets))

    def _attach_helper(self, func: str, path: str, offsets: list[int], cookies: list[int]
                       ) -> str | None:
        """Attach program `func` (not on_probe's chain) at `offsets` of `path`."""
        try:
            prog = self.program.load_func(func, bpfsys.PROG_KPROBE, attach_type(self.multi))
            if self.multi:
                self._links.append(perf_uprobe.link_uprobe_multi(prog, path, offsets, cookies))
                return None
            for offset, cookie in zip(offsets, cookies, strict=True):
                perf_fd = perf_uprobe.open_uprobe(path, offset)
                self._perf_fds.append(perf_fd)
                self._links.append(perf_uprobe.link_bpf(prog, perf_fd, cookie))
        except OSError as err:  # UprobeError, or a program the kernel refused
            return str(err)
        return None

    def hits(self) -> list[int]:
        """How often each planned probe fired, in plan order."""
        table = self.program["probe_hits"]
        return [sum(table[ctypes.c_int(i)]) for i in range(len(self.sites))]

    def notes(self) -> list[str]:
        """How probes were attached, for the report: a multi-link refusal is never silent."""
        notes = [f"{self.multi_sites} probe(s) attached through {self.multi_links} "
                 "multi-uprobe link(s)"] if self.multi_links else []
        if self.ldso_links:
            notes.append("ld.so's r_debug updates probed through one multi-uprobe link")
        return notes + [f"{r.sites} probe(s) in {r.module} fell back to one link per site: "
                        f"the multi-uprobe link was refused: {r.message}"
                        for r in self.multi_refused]

    def close(self) -> None:
        """Detach every probe (closing twice closes nothing)."""
        for fds in (self._links, self._perf_fds):
            _close_all(fds)
        self._links, self._perf_fds = [], []

    def _attach(self, indexes: Iterable[int]) -> None:
        """attach_all for the sites at `indexes` (all of them, or those added later)."""
        if not self.multi:
            for index in indexes:
                self._attach_one(index, self.sites[index])
            return
        for (module, ret), group in _multi_groups(self.sites, indexes).items():
            if not self._attach_multi(module, ret, group):
                for index in group:
                    self._attach_multi_one(index)

    def _attach_multi(self, module: str, retprobe: bool, indexes: list[int]) -> bool:
        try:
            self._link_multi(module, retprobe, indexes)
        except perf_uprobe.UprobeError as err:
            self.multi_refused.append(MultiRefusal(module, retprobe, len(indexes),
                                                   err.errno or 0, err.strerror or str(err)))
            return False
        self.multi_links += 1
        self.multi_sites += len(indexes)
        return True

    def _attach_multi_one(self, index: int) -> None:
        site = self.sites[index]
        try:
            self._link_multi(site.module, site.uretprobe, [index])
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_MULTI, err)

    def _link_multi(self, module: str, retprobe: bool, indexes: list[int]) -> None:
        sites = [self.sites[i] for i in indexes]
        self._links.append(perf_uprobe.link_uprobe_multi(
            self._prog, module, [s.file_offset for s in sites], indexes, retprobe,
            [s.ref_ctr_offset for s in sites]))

    def _attach_one(self, index: int, site: ProbeSite) -> None:
        try:
            perf_fd = perf_uprobe.open_uprobe(site.module, site.file_offset,
                                              retprobe=site.uretprobe,
                                              ref_ctr_offset=site.ref_ctr_offset)
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_OPEN, err)
            return
        self._perf_fds.append(perf_fd)
        try:
            self._links.append(perf_uprobe.link_bpf(self._prog, perf_fd, index))
        except perf_uprobe.UprobeError as err:
            self._failed(index, STAGE_LINK, err)

    def _failed(self, index: int, stage: str, err: OSError) -> None:
        self.failed_probes.append(ProbeFailure(index, stage, err.errno or 0,
                                               err.strerror or str(err)))


def _multi_groups(sites: list[ProbeSite], indexes: Iterable[int]
                  ) -> dict[tuple[str, bool], list[int]]:
    """Indexes of `sites` per (file, uretprobe) that a multi-uprobe link can carry."""
    groups: dict[tuple[str, bool], list[int]] = {}
    for index in indexes:
        site = sites[index]
        groups.setdefault((site.module, site.uretprobe), []).append(index)
    return groups


def _close_all(fds: list[int]) -> None:
    """Close in parallel: removing a uprobe waits ~35 ms for the kernel (RCU) here, and
    the waits of concurrent closes overlap (a detach of 30 probes: 1.1 s one by one)."""
    def close(fd: int) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)
    threads = [threading.Thread(target=close, args=(fd,)) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
