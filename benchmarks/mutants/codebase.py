"""What one codebase of the mutation benchmark is: its tree, build, API and workloads."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import debian
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
