"""Prometheus metrics, read from the kernel maps at scrape time.

Labels are bounded: target, type, operation, kind, reason, map.  Never a
pid, an address or a stack.  The kernel side of serve counts operations per
type as they happen and live objects per allocation site and creation time,
so a scrape reads O(types x sites), never every object; the one exception is
refcntd_live_objects_by_class (service/classmetrics.py), which reads each live object
of a spec's `class:` type once in its life (label `class`, bounded per type).
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypedDict, TypeVar, cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from refcntd.kernel.abi import Stat
from refcntd.kernel.procmem import read_string
from refcntd.outputs.reportstore import StoreStats
from refcntd.service.classmetrics import (
    MAX_CLASS_LABELS,
    OTHER_CLASSES,
    UNREAD,
    ClassCounts,
    fold,
)
from refcntd.session.status import LOST_REASONS, NOTE_REASONS
from refcntd.session.tracer import Tracer

OTHER_TYPES = "_other"  # the one `type` label for types beyond a target's max_type_labels
AGE_BUCKETS = (1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)
OPS = ("init", "get", "put", "release")
K = TypeVar("K")
Aged = tuple[float, int]  # live objects' age (s, the middle of their creation-time bin), count


@dataclass
class TargetStats:
    """What one target's tracers cannot keep in the kernel: exited processes' share."""

    name: str
    age_threshold_s: float
    max_type_labels: int = 100
    warm_up_s: float = 10.0  # objects a process made in its first seconds: not "older"
    tracers: list[Tracer] = field(default_factory=list)
    probes_failed: int = 0
    attach_errors: int = 0
    leaked: dict[str, int] = field(default_factory=dict)
    # of those, the spec's `class:` types by (type, class), as the exit scan read them
    leaked_classes: dict[tuple[str, str], int] = field(default_factory=dict)
    reachable: dict[str, int] = field(default_factory=dict)  # still reachable at exit
    anomalies: dict[str, int] = field(default_factory=dict)
    processes_reported: int = 0
    # reports update the counts on the tracers' report workers, scrapes read copies
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, table: dict[K, int], key: K, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def snapshot(self) -> TargetStats:
        """A consistent copy for one scrape."""
        with self.lock:
            return replace(self, tracers=list(self.tracers), leaked=dict(self.leaked),
                           leaked_classes=dict(self.leaked_classes),
                           reachable=dict(self.reachable), anomalies=dict(self.anomalies),
                           lock=threading.Lock())


class RefcntdCollector:
    """prometheus_client custom collector; `view()` returns the targets under a lock."""

    def __init__(self, view: Callable[[], AbstractContextManager[list[TargetStats]]],
                 report_stats: Callable[[], StoreStats]) -> None:
        self.view = view
        self.report_stats = report_stats
        self._type_cache: dict[tuple[int, int], str] = {}
        self._classes: dict[str, ClassCounts] = {}  # per target: objects' classes read

    def describe(self) -> Iterator[Metric]:
        """Every family collect() yields, without samples (client_python's Collector
        protocol): the registry checks names at registration without reading a map."""
        yield from cast(dict[str, Metric], _families()).values()
        yield from _store_families()

    def collect(self) -> Iterator[Metric]:
        with self.view() as targets:
            families = _families()
            for stats in targets:
                self._collect_target(stats, families)
            yield from cast(dict[str, Metric], families).values()
        yield from _store_families(self.report_stats())

    def _collect_target(self, s: TargetStats, f: _Families) -> None:
        t = s.name
        classes = self._classes.setdefault(t, ClassCounts())  # spec `class:` types only
        for (type_name, cls), n in sorted(classes.counts(s.tracers).items()):
            f["by_class"].add_metric([t, type_name, cls], n)
        for (type_name, cls), n in sorted(fold(Counter(s.leaked_classes)).items()):
            f["leaked_by_class"].add_metric([t, type_name, cls], n)
        ops: dict[tuple[str, str], int] = {}
        live: dict[str, list[Aged]] = {}
        # live objects older than the threshold, but not those their process made while
        # it warmed up (a registry loaded at start lives as long as the process)
        older: dict[str, int] = {}
        kernel_stats: dict[Stat, int] = {}
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        started = ProcessStarts()
        for tracer in s.tracers:
            k = tracer.kernel
            # serve's kernel side counts every operation as it happens (SITES), and
            # live objects per creation time: nothing here walks the objects
            for name, (inits, gets, puts, released) in tracer.released_totals().items():
                for op, n in zip(OPS, (inits, gets, puts, released), strict=True):
                    ops[(name, op)] = ops.get((name, op), 0) + n
            for site in k.site_maps.site_lives(unnamed=True):  # running processes' unnamed objects
                if not site.type_name:
                    name = self._live_type(site.tgid, site.name_ptr)
                    for op, n in zip(OPS, site.ops, strict=True):
                        ops[(name, op)] = ops.get((name, op), 0) + n
            for b in k.site_maps.age_bins(now):
                name = b.type_name or self._live_type(b.tgid, b.name_ptr)
                age = max(0.0, (now - (b.start_ns + b.end_ns) / 2) / 1e9)
                live.setdefault(name, []).append((age, b.count))
                if age > s.age_threshold_s and \
                        not started.warming(b.tgid, b.start_ns, s.warm_up_s):
                    older[name] = older.get(name, 0) + b.count
            for stat, n in k.stats().items():  # summed over the target's binaries
                kernel_stats[stat] = kernel_stats.get(stat, 0) + n
            for m, (used, cap) in k.map_fill().items():
                f["map_entries"].add_metric([t, m], used)
                f["map_capacity"].add_metric([t, m], cap)
            # the program's path, as refcntd_binary_attached_since_seconds says it
            f["processes"].add_metric([t, tracer.plan.binary],
                                      tracer.tracker.running_processes())
        for stat, n in sorted(kernel_stats.items()):
            if stat in LOST_REASONS:
                f["dropped"].add_metric([t, stat.name.lower()], n)
            elif stat in NOTE_REASONS:
                f["notes"].add_metric([t, stat.name.lower()], n)
        attached = sum(len(tr.kernel.probes.sites) - len(tr.kernel.probes.failed_probes)
                       for tr in s.tracers)
        f["probes"].add_metric([t, "attached"], attached)
        f["probes"].add_metric([t, "failed"], s.probes_failed + sum(
            len(tr.kernel.probes.failed_probes) for tr in s.tracers))
        f["attach_errors"].add_metric([t], s.attach_errors)
        for name, _op in ops:  # a known type with nothing live is 0, not an absent series
            live.setdefault(name, [])
        keep = _kept_types(live, ops, s.leaked, s.max_type_labels)
        f["types_pruned"].add_metric([t], sum(tr.type_keeper.pruned for tr in s.tracers))
        for tr in s.tracers:
            module = tr.plan.modules.get(tr.plan.binary)
            f["attached"].add_metric([t, tr.plan.binary, (module.build_id or "") if module
                                      else ""], tr.attached_at)
        f["folded"].add_metric([t], len(set(live) | {n for n, _ in ops} | set(s.leaked))
                               - len(keep))
        live, ops = _fold(live, keep), _fold_ops(ops, keep)
        older = _fold_counts(older, keep)
        leaked = _fold_counts(s.leaked, keep)
        reachable = _fold_counts(s.reachable, keep)
        for (name, op), n in sorted(ops.items()):
            f["operations"].add_metric([t, name, op], n)
        for name, ages in sorted(live.items()):
            f["live"].add_metric([t, name], sum(n for _, n in ages))
            f["older"].add_metric([t, name], older.get(name, 0))
            f["age"].add_metric([t, name], _buckets(ages), sum(a * n for a, n in ages))
        for name, n in sorted(leaked.items()):
            f["leaked"].add_metric([t, name], n)
        for name, n in sorted(reachable.items()):
            f["reachable"].add_metric([t, name], n)
        for kind, n in sorted(s.anomalies.items()):
            f["anomalies"].add_metric([t, kind], n)
        f["reported"].add_metric([t], s.processes_reported)

    def _live_type(self, tgid: int, name_ptr: int) -> str:
        """Type names not readable at init are read from the live process, once."""
        if not name_ptr:
            return "unknown"
        key = (tgid, name_ptr)
        if key not in self._type_cache:
            self._type_cache[key] = read_string(tgid, name_ptr) or "unknown"
            if len(self._type_cache) > 65536:
                self._type_cache.clear()
        return self._type_cache[key]


class ProcessStarts:
    """When each process started, on the clock of the kernel's times (CLOCK_MONOTONIC),
    read once per scrape from /proc/PID/stat (clock ticks since boot)."""

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self.proc_root = proc_root
        self._boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - \
            time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self._starts: dict[int, int | None] = {}

    def warming(self, tgid: int, made_ns: int, warm_up_s: float) -> bool:
        """Whether objects made from `made_ns` (the start of their creation-time bin)
        were made in their process's first `warm_up_s` seconds: a bin that begins
        before then counts whole (a second, or two minutes for objects older than ten:
        start-up objects never count as old, a few made just after may not either)."""
        if warm_up_s <= 0:
            return False
        if tgid not in self._starts:
            self._starts[tgid] = self._read(tgid)
        start = self._starts[tgid]
        return start is not None and made_ns < start + warm_up_s * 1e9

    def _read(self, tgid: int) -> int | None:
        try:
            stat = (self.proc_root / str(tgid) / "stat").read_text()
        except OSError:
            return None  # gone: its objects are reported at its exit
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK") - self._boot_ns


def _kept_types(live: dict[str, list[Aged]], ops: dict[tuple[str, str], int],
                leaked: dict[str, int], cap: int) -> set[str]:
    """The `cap` most active types keep their own label (live objects first, then
    operations, then leaks); the rest share OTHER_TYPES, so a program with
    thousands of type names cannot explode the series count."""
    score: dict[str, tuple[int, int, int]] = {}
    for name in set(live) | {n for n, _ in ops} | set(leaked):
        score[name] = (sum(n for _, n in live.get(name, [])),
                       sum(n for (t, _), n in ops.items() if t == name), leaked.get(name, 0))
    ranked = sorted(score, key=lambda n: (tuple(-v for v in score[n]), n))
    return set(ranked[:cap - 1] if len(ranked) > cap else ranked)


def _fold(live: dict[str, list[Aged]], keep: set[str]) -> dict[str, list[Aged]]:
    out: dict[str, list[Aged]] = {}
    for name, ages in live.items():
        out.setdefault(name if name in keep else OTHER_TYPES, []).extend(ages)
    return out


def _fold_ops(ops: dict[tuple[str, str], int], keep: set[str]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for (name, op), n in ops.items():
        key = (name if name in keep else OTHER_TYPES, op)
        out[key] = out.get(key, 0) + n
    return out


def _fold_counts(counts: dict[str, int], keep: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in counts.items():
        key = name if name in keep else OTHER_TYPES
        out[key] = out.get(key, 0) + n
    return out


def _buckets(ages: list[Aged]) -> list[tuple[str, int]]:
    out = [(str(b), sum(n for a, n in ages if a <= b)) for b in AGE_BUCKETS]
    return out + [("+Inf", sum(n for _, n in ages))]


def _store_families(store: StoreStats | None = None) -> list[Metric]:
    """The report store's counters (None: the families alone, for describe())."""
    written = CounterMetricFamily("refcntd_reports_written", "Report files written")
    errors = CounterMetricFamily("refcntd_report_errors", "Report files that could not be "
                                 "written")
    if store is not None:
        written.add_metric([], store.written)
        errors.add_metric([], store.errors)
    return [written, errors]


class _Families(TypedDict):
    live: GaugeMetricFamily
    older: GaugeMetricFamily
    age: HistogramMetricFamily
    operations: CounterMetricFamily
    leaked: CounterMetricFamily
    leaked_by_class: CounterMetricFamily
    reachable: CounterMetricFamily
    anomalies: CounterMetricFamily
    processes: GaugeMetricFamily
    reported: CounterMetricFamily
    probes: GaugeMetricFamily
    attach_errors: GaugeMetricFamily
    map_entries: GaugeMetricFamily
    map_capacity: GaugeMetricFamily
    dropped: CounterMetricFamily
    notes: CounterMetricFamily
    folded: GaugeMetricFamily
    types_pruned: CounterMetricFamily
    attached: GaugeMetricFamily
    by_class: GaugeMetricFamily


def _families() -> _Families:
    g, c = GaugeMetricFamily, CounterMetricFamily
    return {
        "live": g("refcntd_live_objects", "Objects initialised and not yet released, in "
                  "running traced processes", labels=["target", "type"]),
        "older": g("refcntd_live_objects_older_than_threshold", "Live objects older than the "
                   "target's age_threshold", labels=["target", "type"]),
        "age": HistogramMetricFamily("refcntd_live_object_age_seconds", "Age of live objects",
                                     labels=["target", "type"]),
        "operations": c("refcntd_operations", "Refcount operations seen (init, get, put, and "
                        "release: last put or delete)", labels=["target", "type", "operation"]),
        "leaked": c("refcntd_leaked_objects", "Objects still referenced when their process "
                    "exited, that run would fail: lost (or held by nothing) where the exit scan "
                    "ran, every one where it did not", labels=["target", "type"]),
        "leaked_by_class": c("refcntd_leaked_objects_by_class", "refcntd_leaked_objects of "
                             "the types whose spec reads a class (class:), by the class the "
                             f"exit scan read: each type's {MAX_CLASS_LABELS - 1} largest "
                             f"classes by name, the others class=\"{OTHER_CLASSES}\", "
                             f"unread class=\"{UNREAD}\"",
                             labels=["target", "type", "class"]),
        "reachable": c("refcntd_still_reachable_objects", "Objects still referenced when "
                       "their process exited but still reachable from its memory (valgrind's "
                       "and LeakSanitizer's \"still reachable\": not counted as leaked)",
                       labels=["target", "type"]),
        "anomalies": c("refcntd_anomalies", "Refcount misuse caught (double put, use after "
                       "delete, ...)", labels=["target", "kind"]),
        "processes": g("refcntd_traced_processes", "Traced processes currently running",
                       labels=["target", "binary"]),
        "reported": c("refcntd_processes_reported", "Exited traced processes reported",
                      labels=["target"]),
        "probes": g("refcntd_probes", "Probes by state", labels=["target", "state"]),
        "attach_errors": g("refcntd_target_attach_errors", "Binaries of the target that could "
                           "not be attached at all", labels=["target"]),
        "map_entries": g("refcntd_map_entries", "Kernel map entries in use",
                         labels=["target", "map"]),
        "map_capacity": g("refcntd_map_capacity", "Kernel map capacity",
                          labels=["target", "map"]),
        "folded": g("refcntd_type_labels_folded", "Type names of the target shown as "
                    f"type=\"{OTHER_TYPES}\" because of its max_type_labels", labels=["target"]),
        "attached": g("refcntd_binary_attached_since_seconds", "When each binary of the "
                      "target was attached (Unix time), by the build-id of the file attached: "
                      "a package upgrade shows as a new build-id",
                      labels=["target", "binary", "build_id"]),
        "types_pruned": c("refcntd_types_pruned", "Type names removed from the kernel's "
                          "type table because no object used them (room for new types; their "
                          "counts are kept)", labels=["target"]),
        "dropped": c("refcntd_dropped_records", "Records the kernel side could not keep",
                     labels=["target", "reason"]),
        "by_class": g("refcntd_live_objects_by_class", "Live objects of the types whose spec "
                      "reads a class (class:), by class, read from the running processes' "
                      f"memory: each type's {MAX_CLASS_LABELS - 1} largest classes by name, "
                      f"the others class=\"{OTHER_CLASSES}\", unreadable class=\"{UNREAD}\"",
                      labels=["target", "type", "class"]),
        "notes": c("refcntd_kernel_notes", "Kernel-side counts that are not losses (unknown "
                   "gets, stacks cut short, ...): the report's notes", labels=["target", "note"]),
    }


class BuildInfo:
    """refcntd_build_info: which refcntd, Python, bcc and kernel answer this scrape."""

    def __init__(self, version: str, bcc: str) -> None:
        self.labels = {"version": version, "python": platform.python_version(),
                       "bcc": bcc, "kernel": platform.release()}

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        g = self._family()
        g.add_metric(list(self.labels.values()), 1)
        yield g

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily("refcntd_build_info", "Always 1; the labels say what is "
                                 "running", labels=list(self.labels))
