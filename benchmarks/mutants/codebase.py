"""What one codebase of the mutation benchmark is: its tree, build, API and workloads."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import debian
import tracefs
import truth
from sites import Api


@dataclass(frozen=True)
class Workload:
    label: str
    argv: tuple[str, ...]


@dataclass
class Codebase:
    name: str
    work: Path  # everything of this codebase under the benchmark's --out
    source: Path  # the tree the sites are read from and mutated in
    build_dir: Path
    api: Api
    targets: dict[str, str]  # a call instruction's callee -> "get" or "put"
    scan: list[str]  # globs (relative to source) of the files whose sites count
    binaries: list[Path]
    workloads: list[Workload]
    spec: Path
    env: dict[str, str] = field(default_factory=dict)
    build_cmd: list[str] = field(default_factory=list)
    prepared: dict[str, object] = field(default_factory=dict)
    # C++ (harfbuzz): a site counts only where its call instruction is in its own
    # function's code (not an inlined copy), and that function's symbol (mangled, as
    # refcntd names it) is the truth, not the scanner's name (runner.executed_sites)
    cxx: bool = False

    def run_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def build(self) -> float:
        """Build (incrementally); seconds taken.  Raises CalledProcessError."""
        started = time.monotonic()
        subprocess.run(self.build_cmd, check=True, capture_output=True, text=True)
        return round(time.monotonic() - started, 1)

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.source)) for g in self.scan
                      for p in self.source.glob(g))

    def role(self, name: str) -> str:
        return "get" if name in self.api.gets else "put"


def debian_meson(cb: Codebase, package: str, options: list[str]) -> dict[str, object]:
    """`apt-get source PACKAGE` (once) as cb.source, meson setup (once) and an incremental
    build; the steps taken, for the results."""
    steps: dict[str, object] = {}
    if not cb.source.exists():
        cb.source.symlink_to(debian.source(package, cb.work / "debian-source"))
    steps["source"] = f"apt-get source {package} ({cb.source.resolve().name})"
    if not (cb.build_dir / "build.ninja").exists():
        t = time.monotonic()
        subprocess.run(["meson", "setup", str(cb.build_dir), *options], cwd=cb.source,
                       check=True, capture_output=True)
        steps["configure_s"] = round(time.monotonic() - t, 1)
    fresh = not cb.binaries[0].exists()
    steps["build_s" if fresh else "rebuild_check_s"] = cb.build()
    steps["build_command"] = f"meson setup BUILD {' '.join(options)} && ninja -C BUILD"
    return steps


def debian_configure(cb: Codebase, package: str, configure: list[str],
                     autoreconf: bool = False) -> dict[str, object]:
    """`apt-get source PACKAGE` (once) as cb.source, `autoreconf -fi` in it (once, when
    asked: Debian's patches change configure.ac or Makefile.am), and its `configure` run
    (once) in cb.build_dir, out of tree; the steps taken, for the results."""
    steps: dict[str, object] = {}
    if not cb.source.exists():
        cb.source.symlink_to(debian.source(package, cb.work / "debian-source"))
    steps["source"] = f"apt-get source {package} ({cb.source.resolve().name})"
    marker = cb.work / ".autoreconf-done"
    if autoreconf and not marker.exists():
        t = time.monotonic()
        subprocess.run(["autoreconf", "-fi"], cwd=cb.source, check=True, capture_output=True)
        marker.write_text("autoreconf -fi\n")
        steps["autoreconf_s"] = round(time.monotonic() - t, 1)
    cb.build_dir.mkdir(parents=True, exist_ok=True)
    if not (cb.build_dir / "Makefile").exists():
        t = time.monotonic()
        subprocess.run([str(cb.source / "configure"), *configure], cwd=cb.build_dir,
                       check=True, capture_output=True)
        steps["configure_s"] = round(time.monotonic() - t, 1)
    return steps


def api_probes(lib: Path, constructors: dict[str, str] | Sequence[tuple[str, str]],
               gets: frozenset[str], puts: frozenset[str], tag: str
               ) -> tuple[list[tracefs.Probe], dict[str, truth.Rule]]:
    """The truth's probes for a library whose objects are made by constructors that
    return them (type -> function, or (type, function) pairs when a type has several)
    and counted by get/put functions taking the object first: the constructors'
    returns, the entries of every get and put."""
    from coverage import symbol_offsets
    pairs = list(constructors.items() if isinstance(constructors, dict) else constructors)
    ops = sorted(gets | puts)
    at = symbol_offsets(lib, [*(f for _, f in pairs), *ops])
    found: list[tracefs.Probe] = []
    rules: dict[str, truth.Rule] = {}
    for i, (type_, f) in enumerate(pairs):
        found.append(tracefs.Probe(f"{tag}_new{i}", str(lib), at[f], "obj=$retval:x64",
                                   ret=True))
        rules[f"{tag}_new{i}"] = truth.Rule(truth.INIT_RETURN, type_)
    for i, f in enumerate(ops):
        found.append(tracefs.Probe(f"{tag}_op{i}", str(lib), at[f], "obj=%di:x64"))
        rules[f"{tag}_op{i}"] = truth.Rule(truth.PUT_FREES if f in puts else truth.GET)
    return found, rules
