"""Leaked and live objects as a pprof profile: a gzip'd `perftools.profiles.Profile`.

One sample per (process, type, allocation stack) with three values:

* `objects/count`: the objects (leaked at exit; live at detach or now),
* `references/count`: the references they still hold (the sum of their counts),
* `age/nanoseconds`: the sum of their ages (÷ objects: their mean age), which
  weighs a flame graph by how long objects have been held (nanoseconds: objects a
  test leaks are often under a millisecond old, and whole milliseconds summed
  them to 0; pprof shows the value in the unit that suits it).

`period_type` is `objects/count` with `period` 1, the same in every profile
refcntd writes (Pyroscope keys a series by sample and period type).  Labels:
`target`, `type`, `process` (command name), and `state` in a saved run.  The
probed refcount function itself (`__refcnt__init`) is left off the stacks, so
each stack's leaf, pprof's "flat", is the function that made the object.
Locations carry the module's own (ELF) address of the frame; each module is
one mapping, as if loaded at its link address, with the build-id of the file
at that path.  Every value is a count of what is there at the moment the
profile is taken: a scraper must not subtract successive profiles (Alloy's
`delta = false`, Parca's default).
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from refcntd import __version__
from refcntd.analysis.model import LeakedObject, LeakGroup, RunResult
from refcntd.binary.elf import read_build_id
from refcntd.errors import UsageError
from refcntd.inputs.outputfile import STDOUT, write_output
from refcntd.outputs.ciformats import probed_functions
from refcntd.outputs.profileproto import message
from refcntd.symbolize.symbolizer import Frame
from refcntd.text import visible

SAMPLE_TYPES = (("objects", "count"), ("references", "count"), ("age", "nanoseconds"))
PERIOD_TYPE = ("objects", "count")
PERIOD = 1
CONTENT_TYPE = "application/octet-stream"  # what Alloy's pyroscope.scrape accepts
_CHUNK = 65536  # objects read at a time from a group drained as columns


@dataclass(frozen=True)
class Sample:
    """One (process, type, allocation stack), innermost frame first."""

    frames: tuple[Frame, ...]
    values: tuple[int, int, int]  # objects, references, sum of ages in ns
    labels: tuple[tuple[str, str], ...]


def run_profile(results: Sequence[RunResult], types: frozenset[str] | None = None,
                time_ns: int = 0, live: bool = False) -> bytes:
    """The gzip'd profile of every process of `results` (one per target when live),
    only types in `types` when given.  `time_ns` 0: none (a saved run renders the
    same bytes every time)."""
    samples = [s for r in results for s in run_samples(r, types, live)]
    what = "live objects" if live else "leaked objects (and any live at detach)"
    comments = [f"refcntd {__version__}: {what} by allocation stack",
                *(f"{'target' if live else r.mode + ' of'} {r.target}, spec {r.spec}"
                  for r in results[:16])]
    return encode(samples, comments, time_ns)


def run_samples(result: RunResult, types: frozenset[str] | None = None,
                live: bool = False) -> Iterator[Sample]:
    probed = probed_functions(result)
    for p in result.processes:
        base = (("target", result.target), ("process", p.comm or str(p.pid)))
        state = () if live else (("state", p.state),)
        for g in p.groups:
            if types is not None and g.type_name not in types:
                continue
            kind = (("kind", g.kind),) if g.kind else ()  # --leak-kinds
            named = (("class", g.class_name),) if g.class_name else ()  # spec `class:`
            yield Sample(alloc_frames(g.frames, probed), group_values(g),
                         (*base, ("type", g.type_name), *named, *state, *kind))


def alloc_frames(frames: tuple[Frame, ...], probed: frozenset[str]) -> tuple[Frame, ...]:
    """Without the probed function at the top of the stack (an entry probe's frame #0;
    a return probe's stack starts at the caller already)."""
    start = 0
    while start < len(frames) - 1 and frames[start].function in probed:
        start += 1
    return frames[start:]


def group_values(g: LeakGroup) -> tuple[int, int, int]:
    """(objects, references, sum of ages in ns); a group drained as columns (or any sequence with
    `sums()`) is summed without an object each, another read a chunk at a time."""
    objects = g.objects
    n, refs, age_ns = len(objects), 0, 0
    sums = getattr(objects, "sums", None)
    if sums is not None:
        refs, age_ns = sums()
        return n, refs, age_ns
    chunks: Iterable[Sequence[LeakedObject]] = (objects,) if isinstance(objects, list) \
        else (objects[i:i + _CHUNK] for i in range(0, n, _CHUNK))
    for chunk in chunks:
        refs += sum(o.count for o in chunk)
        age_ns += sum(o.age_ns for o in chunk)
    return n, refs, age_ns


def write_profile(result: RunResult, path: str) -> None:
    """`run --pprof FILE`, `report --format pprof --output FILE`."""
    write_bytes(run_profile([result]), path)


def write_bytes(data: bytes, path: str | None) -> None:
    """To `path` (outputfile: a file replaced, a device, FIFO or /dev/stdout written in
    place), or to standard output (None or `-`) unless it is a terminal (like gzip)."""
    if path is None or path == STDOUT:
        if sys.stdout.isatty():
            raise UsageError("a pprof profile is binary: not written to a terminal",
                             "give --output FILE.pb.gz, or redirect standard output")
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        write_output(path, data)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


def encode(samples: Iterable[Sample], comments: Sequence[str] = (), time_ns: int = 0) -> bytes:
    """The samples as a gzip'd Profile (gzip without a timestamp: same input, same bytes)."""
    builder = _Builder()
    for sample in samples:
        builder.add(sample)
    return gzip.compress(builder.finish(comments, time_ns), compresslevel=6, mtime=0)


@dataclass
class _Builder:
    profile: Any = field(default_factory=lambda: message("Profile")())
    strings: dict[str, int] = field(default_factory=lambda: {"": 0})
    mappings: dict[str, Any] = field(default_factory=dict)
    locations: dict[tuple[str, int, str], int] = field(default_factory=dict)
    functions: dict[tuple[str, str], int] = field(default_factory=dict)
    build_ids: dict[str, str] = field(default_factory=dict)

    def s(self, text: str) -> int:
        """The string's index; control characters escaped as in the text report (a
        type name is whatever bytes the traced program holds), surrogates too."""
        clean = visible(text).encode("utf-8", "backslashreplace").decode()
        return self.strings.setdefault(clean, len(self.strings))

    def add(self, sample: Sample) -> None:
        out = self.profile.sample.add()
        out.location_id.extend(self._location(f) for f in sample.frames)
        out.value.extend(sample.values)
        for key, value in sample.labels:
            out.label.add(key=self.s(key), str=self.s(value))

    def _location(self, f: Frame) -> int:
        key = (f.module, f.vaddr, f.raw if not f.module else "")
        found = self.locations.get(key)
        if found is not None:
            return found
        loc = self.profile.location.add(id=len(self.locations) + 1, address=f.vaddr)
        self.locations[key] = loc.id
        if f.module:
            loc.mapping_id = self._mapping(f)
        name = f.function or ("" if f.module else f"?? {f.raw}")
        if name:
            loc.line.add(function_id=self._function(name, f.file), line=f.line)
        return int(loc.id)

    def _mapping(self, f: Frame) -> int:
        m = self.mappings.get(f.module)
        if m is None:
            m = self.profile.mapping.add(id=len(self.mappings) + 1, filename=self.s(f.module),
                                         build_id=self.s(self._build_id(f.module)))
            self.mappings[f.module] = m
        m.memory_limit = max(m.memory_limit, (f.vaddr | 0xfff) + 1)
        m.has_functions |= bool(f.function)
        m.has_filenames |= bool(f.file)
        m.has_line_numbers |= bool(f.line)
        return int(m.id)

    def _build_id(self, path: str) -> str:
        if path not in self.build_ids:
            self.build_ids[path] = (read_build_id(path) or "") if path.startswith("/") else ""
        return self.build_ids[path]

    def _function(self, name: str, file: str) -> int:
        key = (name, file)
        if key not in self.functions:
            self.functions[key] = len(self.functions) + 1
            self.profile.function.add(id=self.functions[key], name=self.s(name),
                                      system_name=self.s(name), filename=self.s(file))
        return self.functions[key]

    def finish(self, comments: Sequence[str], time_ns: int) -> bytes:
        p, vt = self.profile, message("ValueType")
        p.sample_type.extend(vt(type=self.s(t), unit=self.s(u)) for t, u in SAMPLE_TYPES)
        p.period_type.CopyFrom(vt(type=self.s(PERIOD_TYPE[0]), unit=self.s(PERIOD_TYPE[1])))
        p.period = PERIOD
        p.default_sample_type = self.s(SAMPLE_TYPES[0][0])
        p.comment.extend(self.s(c) for c in comments)
        p.time_nanos = time_ns
        p.string_table.extend(self.strings)  # insertion order is index order
        return bytes(p.SerializeToString())
