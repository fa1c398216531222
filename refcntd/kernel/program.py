"""bpf/refcntd.c built for a set of options: its compile flags, the compiled-program
cache, bcc's compile when the cache has no entry, and the maps and programs made from
an entry (Program), the same whether compiled just now or cached.

One compiled object serves every option set: the flags only size maps, and the
options that pick branches are the program's run-time configuration (knobs.py),
written into each start's maps.  `refcntd prebuild` compiles it once; with
REFCNTD_NO_COMPILE=1 a start that would still need clang fails instead.

bcc itself is called only by bcccompile.py, in a child process (loader.py, which
attaches and reads, never touches it).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refcntd.binary import cpus
from refcntd.errors import EnvironmentProblem
from refcntd.kernel import bcccompile, bpfsys, btf, features, knobs, layouts, perf_uprobe, progcache
from refcntd.paths import BPF_DIR, CACHE_DIR


@dataclass(frozen=True)
class KernelOptions:
    filtered: bool  # only processes registered in `procs` (run, --pid)
    has_delete: bool
    absorbs_put: bool = False  # a put role absorbs its inner put: every put looks for one
    max_objects: int = 1 << 20
    max_stacks: int = 8192
    max_procs: int = 16384
    max_types: int = 1024
    max_graves: int = 16384
    exit_code_offset: int | None = None
    history: tuple[str, ...] | None = None  # type names, ("all",), or None: no history
    history_depth: int = 16  # events kept per object; a power of two <= abi.HISTORY_DEPTH
    max_history: int = 65536  # objects with a history at once
    max_sites: int = 16384
    max_paths: int = 262144  # (object, path) counts of objects with history
    comm_filter: tuple[str, ...] = ()  # system-wide: only these command names
    exe_filter: bool = False  # system-wide: only processes running the programs given
    cgroup_id: int | None = None  # system-wide: only this cgroup v2
    unwind_offsets: dict[str, int] | None = None  # OFF_* for unwind.h; None: frame pointers only
    max_cfi_rows: int = 1 << 22
    max_modules: int = 1024
    ringbuf_pages: int = 1024  # events ring buffer, pages (a power of 2)
    hold: bool = False  # stop processes mapping unscanned modules (exported call-site mode)
    hold_tables: bool = False  # ... and those mapping a probed module before their tables
    hold_execs: bool = False  # ... and traced processes exec'ing a file nobody scanned (run)
    sites: bool = False  # count live objects per allocation site and age (serve)
    max_alloc_sites: int = 65536  # (process, type, allocation stack) with live objects
    max_age_bins: int = 65536  # (process, type, creation-time bin) with live objects
    max_vetted: int = 65536  # holding: modules user space has scanned
    max_mmap_calls: int = 4096  # unwinding: threads inside an mmap(PROT_EXEC) at once


@dataclass(frozen=True)
class KernelChoices:
    """What this start does on the running kernel, decided here from its features
    (features.py): the program variant compiled, how probes attach, the fallbacks said
    in one note each, and what is missing with no fallback (refused, exit 24)."""

    found: features.Features
    multi: bool  # multi-uprobe links; False: one perf event per probe site
    group_dead: bool  # sched_process_exit's field; False: task->signal->live (BTF)
    live_offsets: tuple[int, int] | None  # task_struct.signal, signal_struct.live
    notes: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def cflags(self) -> list[str]:
        """The -D flags that pick code by kernel (part of the compiled program's key)."""
        return [f"-DREFCNTD_GROUP_DEAD={int(self.group_dead)}"]

    def require(self) -> None:
        if self.missing:
            raise EnvironmentProblem(self.missing[0], "boot a newer kernel: docs/install.md "
                                     "lists the kernels refcntd is tested on")


# Every kernel feature refcntd uses: (Features field, what it is, a Linux that has it
# (the first, where known: group_dead is measured absent on 6.12, present on 6.18),
# what refcntd does without it; "" = nothing: refused).  `check` prints this.
FEATURES = (
    ("uprobe_pmu", "uprobes as perf events (the uprobe PMU)", "4.17", ""),
    ("ringbuf", "the BPF ring buffer", "5.8", ""),
    ("attach_cookie", "the bpf_get_attach_cookie helper", "5.15", ""),
    ("uprobe_multi", "multi-uprobe links (BPF_TRACE_UPROBE_MULTI)", "6.6",
     "one perf event per probe (slower to attach and detach; the same counts)"),
    ("group_dead", "sched_process_exit's group_dead field", "6.18",
     "a process ends when task->signal->live reaches 0 (read at BTF offsets)"),
    ("btf", "kernel BTF (/sys/kernel/btf/vmlinux)", "5.2 with CONFIG_DEBUG_INFO_BTF",
     "no exit codes, frame-pointer stacks only; needed where group_dead is missing"),
    ("soft_dirty", "soft-dirty pages (clear_refs 4, pagemap bit 55)",
     "3.11 with CONFIG_MEM_SOFT_DIRTY", "GET /leaks copies the memory while the process "
     "is stopped, instead of only the pages written since a copy made while it ran"),
    ("pagemap_scan", "the PAGEMAP_SCAN ioctl with PAGE_IS_SOFT_DIRTY", "6.8",
     "with soft-dirty pages, pagemap read 8 bytes a page in the stop (24-40 ms per GiB "
     "here, 0.8 ms with the ioctl)"),
)


def kernel_choices(found: features.Features | None = None) -> KernelChoices:
    """The one decision per feature: use it, fall back (one note), or refuse.  A fact
    that could not be probed (no privileges) is taken as present."""
    found = found or features.current()
    release, live = found.release, _live_offsets() if found.btf is not False else None
    missing = [f"the running kernel {release} lacks {what}, which refcntd needs (Linux "
               f"{since} has it)" for name, what, since, fallback in FEATURES
               if getattr(found, name) is False and not fallback]
    group_dead = found.group_dead is not False
    if not group_dead and live is None:
        missing.append(f"the running kernel {release} has neither sched_process_exit's "
                       "group_dead field (Linux 6.18 has it) nor the BTF (CONFIG_DEBUG_INFO_BTF) "
                       "to read task->signal->live instead: a process's end cannot be told")
    notes = tuple(f"kernel {release} lacks {what} (Linux {since} has it): {fallback}"
                  for name, what, since, fallback in FEATURES[3:5]
                  if getattr(found, name) is False)
    return KernelChoices(found, found.uprobe_multi is not False, group_dead, live, notes,
                         tuple(missing))


def _live_offsets() -> tuple[int, int] | None:
    signal = btf.member_offset("task_struct", "signal")
    live = btf.member_offset("signal_struct", "live")
    return None if signal is None or live is None else (signal, live)


def probe_attach_type(choices: KernelChoices) -> int:
    """The expected_attach_type of every program attached to a probe: the kernel links a
    multi-typed program to nothing but a multi-uprobe link."""
    return perf_uprobe.BPF_TRACE_UPROBE_MULTI if choices.multi else -1


HOLD_SPARE_PROBES = 256  # probe slots left free for the call sites of modules mapped later
EXEC_SPARE_PROBES = 4096  # ... and for the programs a traced tree execs (hold_execs)


def bpf_cflags(opts: KernelOptions, probe_count: int) -> list[str]:
    """Every -D the BPF program is compiled with: map sizes only, so that the cached
    program serves every option set (`resized`); the maps of a concern this start does
    not use (history, per-site counts, unwinding, holding) get one entry."""
    unwind = opts.unwind_offsets is not None
    hold, history = opts.hold and unwind, opts.history is not None
    sizes = {"MAX_OBJECTS": opts.max_objects, "MAX_STACKS": opts.max_stacks,
             "MAX_PROCS": opts.max_procs, "MAX_TYPES": opts.max_types,
             "MAX_PROBES": probe_slots(probe_count + spare_probes(opts)),
             "MAX_GRAVES": opts.max_graves, "RINGBUF_PAGES": opts.ringbuf_pages,
             "MAX_CFI_ROWS": opts.max_cfi_rows if unwind else 1,
             "MAX_MODULES": opts.max_modules if unwind else 1,
             "MAX_MMAP_CALLS": opts.max_mmap_calls if unwind else 1,
             "MAX_VETTED": opts.max_vetted if hold else 1,
             "MAX_HELD": opts.max_procs if hold else 1,
             "MAX_ALLOC_SITES": opts.max_alloc_sites if opts.sites else 1,
             "MAX_AGE_BINS": opts.max_age_bins if opts.sites else 1,
             "MAX_HISTORY": opts.max_history if history else 1,
             "MAX_SITES": opts.max_sites if history else 1,
             "MAX_PATHS": opts.max_paths if history else 1}
    return [f"-I{BPF_DIR}", *(f"-D{name}={value}" for name, value in sizes.items())]


def spare_probes(opts: KernelOptions) -> int:
    """Probe slots for what is probed after start: call sites of modules mapped later,
    the programs a traced tree execs (each with its own copy of the functions)."""
    return (HOLD_SPARE_PROBES if opts.hold else 0) + (EXEC_SPARE_PROBES if opts.hold_execs
                                                      else 0)


_INLINED = re.compile(r'^#include "(\w+\.h)"\s*/\* pasted in by kernel/program.py \*/$', re.M)


def program_text(main: Path = BPF_DIR / "refcntd.c") -> str:
    """refcntd.c with the headers that use maps pasted in (each concern's header).

    bcc rewrites `map.lookup(...)` only in the main source file; in an
    #included file the call stays a call through a function pointer and the
    program fails to load ("unknown opcode 8d").
    """
    return _INLINED.sub(lambda m: (main.parent / m[1]).read_text(), main.read_text())


def probe_slots(probe_count: int) -> int:
    """probe_cfgs' size: a power of two >= 16, so a compile started before the binary
    analysis has counted the probes (kernel/precompile.py) usually has the right size."""
    slots = 16
    while slots < probe_count:
        slots *= 2
    return slots


def compile_program(opts: KernelOptions, probe_count: int, cached: bool = True) -> Program:
    """bpf/refcntd.c's maps created and its programs ready to load: from the
    compiled-program cache without bcc (~0.05 s), else compiled by bcc (a full compile,
    2-4 s, or a maps-only one for a new map layout, ~0.8 s; the results are cached).
    Also run ahead in a thread (precompile.py).  The running kernel's features pick the
    variant (kernel_choices); one it cannot run on is refused here, before any compile."""
    choices = kernel_choices()
    choices.require()
    text, cflags = program_text(), bpf_cflags(opts, probe_count) + choices.cflags
    key = cache_key(text, cflags)
    sizes = progcache.sizing_flags(text, cflags)
    entry = progcache.load(CACHE_DIR, key) if cached else None
    layout = progcache.load_layout(CACHE_DIR, key) if entry is not None else None
    if layout is not None:
        layout = layouts.resized(layout, sizes)
    if layout is not None:
        layout = layouts.history_sized(layout, opts.history_depth)
    if entry is not None and layout is not None and not layouts.fits(layout, opts, entry.maps):
        layout = None
    how, checked, from_cache = "cached programs, no compile", frozenset[str](), entry is not None
    if entry is None or layout is None:
        how = "BPF compile" if entry is None else "maps-only compile + cached programs"
        if os.environ.get("REFCNTD_NO_COMPILE") == "1":
            raise EnvironmentProblem(f"REFCNTD_NO_COMPILE=1, and this start needs a {how}: "
                                     f"{CACHE_DIR / 'bpf'} has no program for this kernel, "
                                     f"bcc and {BPF_DIR}",
                                     "run `refcntd prebuild` (scripts/setup.sh does), or "
                                     "unset REFCNTD_NO_COMPILE")
        entry, layout, checked = _compile(text, cflags, key, sizes, opts, entry)
    if "bcc" not in sys.modules:
        how += " (bcc not loaded)"
    return Program(entry, layout, opts, how, from_cache, checked, choices)


def cache_key(text: str, cflags: list[str], bpf_dir: Path = BPF_DIR) -> str:
    """The compiled program's key: its text (program_text), every header in bpf/ (the
    ones included, not pasted in, such as refcntd.h, are not in the text), the flags
    that do more than size maps (the kernel's variant: KernelChoices.cflags), bcc and
    the kernel headers."""
    headers = "".join(f"/* {p.name} */\n{p.read_text()}" for p in sorted(bpf_dir.glob("*.h")))
    return progcache.entry_key(text + headers, cflags, _toolchain())


def _compile(text: str, cflags: list[str], key: str, sizes: dict[str, str],
             opts: KernelOptions, entry: progcache.Entry | None
             ) -> tuple[progcache.Entry, progcache.Layout, frozenset[str]]:
    """bcc's compile (bcccompile.py, in a child process), kept in the cache: the whole
    program when there is no `entry` (its instructions are kept), else the map
    declarations only; the maps as the kernel created them either way.  Program makes
    its own maps and programs from these.  Also the structs compared field by field
    with abi.py."""
    source = text if entry is None else progcache.maps_only(text)
    with cpus.busy():  # an analysis running beside it leaves this CPU to clang
        done = bcccompile.compile_in_child(source, cflags, entry is None, CACHE_DIR / "bpf")
    layout = progcache.Layout(key, done.specs, sizes, done.btf)
    compiled = entry is None
    if entry is None:
        entry = progcache.Entry(key, done.names, done.functions or {})
    sized = layouts.history_sized(layout, opts.history_depth)
    if not layouts.fits(sized, opts, entry.maps):
        raise EnvironmentProblem("the BPF program's maps do not match refcntd/kernel/abi.py",
                                 "run `python -m refcntd.kernel.abigen`")
    if compiled:
        progcache.store(CACHE_DIR, entry)
    progcache.store_layout(CACHE_DIR, layout)
    return entry, sized, done.checked


CHAIN = ("on_unwind", "on_body", "on_unwind_more")  # probe_progs' slots, see bpf/refcntd.c
TRACEPOINT_PREFIX = "tracepoint__"  # bcc's TRACEPOINT_PROBE(category, event) functions
MAPPING_TRACEPOINTS = frozenset(TRACEPOINT_PREFIX + name for name in (  # bpf/execmaps.h
    "sched__sched_process_exec", "syscalls__sys_enter_mmap", "syscalls__sys_exit_mmap",
    "syscalls__sys_enter_mprotect", "syscalls__sys_enter_munmap"))


class Program:
    """bpf/refcntd.c's maps, created here, and its programs, loaded from their compiled
    instructions with these maps' fds: the same whether compiled just now or cached."""

    def __init__(self, entry: progcache.Entry, layout: progcache.Layout, opts: KernelOptions,
                 how: str, from_cache: bool, layout_checked: frozenset[str],
                 choices: KernelChoices) -> None:
        """`layout` fits `entry` (compile_program checked it); `how` says, for --verbose,
        whether bcc compiled; `layout_checked`: the structs compared with bcc's;
        `choices`: what the running kernel's features decided.  The configuration
        (knobs.py) is written and frozen before any program loads."""
        self.entry, self.how, self.from_cache, self.opts = entry, how, from_cache, opts
        self.choices = choices
        self.layout_checked = layout_checked
        self.tables: dict[str, bpfsys.Table] = {}
        self._loaded: dict[tuple[str, int, int], int] = {}
        self._tracepoints: list[int] = []
        self._ring: bpfsys.RingBuffer | None = None
        btf_fd = -1
        try:
            if layout.btf:
                with contextlib.suppress(OSError):  # without it, bpftool shows raw bytes only
                    btf_fd = bpfsys.load_btf(layout.btf)
            for spec in layout.maps:
                fd = bpfsys.create_map(spec.name, spec.map_type, spec.key_size,
                                       spec.value_size, spec.max_entries, spec.flags,
                                       (btf_fd, spec.btf_key, spec.btf_value)
                                       if btf_fd >= 0 else None)
                key, value = layouts.map_types(spec.name, spec, opts)
                self.tables[spec.name] = bpfsys.Table(spec.name, fd, spec.map_type, key,
                                                      value, spec.max_entries)
            knobs.write(self.tables[knobs.MAP], opts, choices.live_offsets)
        except OSError as err:
            self.cleanup()
            raise EnvironmentProblem(f"the BPF maps could not be created: {err}",
                                     "is the locked-memory limit or the kernel's "
                                     "BPF memory exhausted?") from None
        finally:
            if btf_fd >= 0:
                os.close(btf_fd)  # the maps hold their own reference

    def __getitem__(self, name: str) -> bpfsys.Table:
        return self.tables[name]

    def load_func(self, name: str, prog_type: int, attach_type: int = -1) -> int:
        """A program's fd, loaded once per (name, type, attach type)."""
        key = (name, prog_type, attach_type)
        if key not in self._loaded:
            function = self.entry.functions.get(name)
            if function is None:
                raise OSError(errno.ENOENT, f"Unknown program {name}")
            code = function.relocated({m: t.map_fd for m, t in self.tables.items()})
            self._loaded[key] = bpfsys.load_program(name, prog_type, code, attach_type)
        return self._loaded[key]

    def preload(self, attach_type: int, unwanted: Callable[[], bool] = lambda: False) -> None:
        """Load the probe programs now: the verifier's ~0.25 s then overlaps the analysis
        when this runs in precompile's thread (which stops once it is `unwanted`).
        on_body, the longest, is verified in a second thread meanwhile: the verifier
        runs inside each bpf() call, without the GIL, so two use both cores."""
        def load(names: tuple[str, ...], prog_type: int = bpfsys.PROG_KPROBE,
                 attach: int = attach_type) -> None:
            for name in names:
                if unwanted():
                    return
                self.load_func(name, prog_type, attach)
        with ThreadPoolExecutor(2) as pool:
            done = [pool.submit(load, ("on_body",)),
                    pool.submit(load, ("on_probe", "on_unwind", "on_unwind_more")),
                    # the exit, fork and exec hooks: 0.28 s on the main thread otherwise
                    pool.submit(load, self._tracepoint_names(), bpfsys.PROG_TRACEPOINT, -1)]
        for future in done:
            future.result()

    def _tracepoint_names(self) -> tuple[str, ...]:
        """The TRACEPOINT_PROBE programs this run attaches (the mapping hooks of
        bpf/execmaps.h only when unwinding: without, they would return at once)."""
        unwind = self.opts.unwind_offsets is not None
        return tuple(name for name in sorted(self.entry.functions)
                     if name.startswith(TRACEPOINT_PREFIX)
                     and (unwind or name not in MAPPING_TRACEPOINTS))

    def attach_tracepoints(self, tracefs: Path) -> None:
        """The TRACEPOINT_PROBE programs (process exit, fork, exec), attached."""
        for name in self._tracepoint_names():
            fd = self.load_func(name, bpfsys.PROG_TRACEPOINT)
            category, event = name[len(TRACEPOINT_PREFIX):].split("__", 1)
            perf_fd = perf_uprobe.open_tracepoint(tracefs, category, event)
            self._tracepoints.append(perf_fd)
            self._tracepoints.append(perf_uprobe.link_bpf(fd, perf_fd, 0))

    def open_ring_buffer(self, name: str, callback: Callable[[Any, int, int], int]) -> None:
        self._ring = bpfsys.RingBuffer(self.tables[name].map_fd, callback)

    def poll(self, timeout_ms: int) -> None:
        if self._ring is not None:
            self._ring.poll(timeout_ms)

    def cleanup(self) -> None:
        """Close everything: links, programs, the ring buffer, maps."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for fd in [*reversed(self._tracepoints), *self._loaded.values(),
                   *(t.map_fd for t in self.tables.values())]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._tracepoints, self._loaded, self.tables = [], {}, {}


_VERSION_H = "include/generated/uapi/linux/version.h"


def _toolchain() -> dict[str, str]:
    """What besides the text and flags shapes the instructions: bcc and the kernel headers
    (found without importing bcc: a cached start never loads it)."""
    headers = os.environ.get("BCC_KERNEL_SOURCE", "")
    spec = importlib.util.find_spec("bcc")
    return {"libbcc": progcache.file_identity(_libbcc_path()),
            "bcc": progcache.file_identity(spec.origin if spec and spec.origin else "bcc"),
            "headers": progcache.file_identity(headers),
            "version.h": progcache.file_identity(Path(headers) / _VERSION_H),
            "kernel": os.uname().release}


def _libbcc_path() -> str:
    """Where the dynamic linker finds libbcc.so.0 for bcc (LD_LIBRARY_PATH, then the
    system's library directories).

    Called from the early-compile thread: sysconfig.get_config_var fills its table on
    first use without a lock, and a concurrent caller saw no MULTIARCH, so the key
    named no libbcc and the next start missed the cache.  os.uname() has no state."""
    arch = f"{os.uname().machine}-linux-gnu"
    dirs = [*filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")),
            f"/usr/local/lib/{arch}", "/usr/local/lib", f"/lib/{arch}", f"/usr/lib/{arch}",
            "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    for d in dirs:
        path = Path(d) / "libbcc.so.0"
        if path.exists():
            return str(path)
    return "libbcc.so.0: not found"
