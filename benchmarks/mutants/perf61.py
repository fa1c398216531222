"""perf 6.1: the codebase issue 55 is judged on, never used to write or measure a rule.

tools/perf of Debian's linux-source-6.1 (the kernel Debian 12 ships) with
perf/refcnt-stubs-6.1.patch (the same stubs as perf 6.12's patch, ported), built as
perf 6.12 is (codebases.perf).  Its workloads are `perf report` as the issue ran it
and the other report-side commands on one recording of an ordinary workload; `perf
test`'s numbering differs from 6.12's and is left out.  Its answers are kept apart:
loco.py's table is never made from them (`--judge-only`).
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import codebases
import debian
from codebase import Codebase, Workload

HERE = Path(__file__).resolve().parent
TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
PACKAGES = ["linux-source-6.1", *codebases.PERF_PACKAGES[1:]]


def codebase(out: Path) -> Codebase:
    base = codebases.perf(out)
    work = out / "perf61"
    src = work / "linux-source-6.1"
    build = work / "build"
    perf_bin = build / "perf"
    data = work / "work.data"
    report = (str(perf_bin), "report", "-i", str(data), "--stdio")
    return dataclasses.replace(
        base, name="perf61", work=work, source=src / "tools" / "perf", build_dir=build,
        binaries=[perf_bin],
        workloads=[Workload("perf report", report),
                   Workload("perf report -g none", (*report, "-g", "none", "--no-children")),
                   Workload("perf buildid-list", (str(perf_bin), "buildid-list", "-i",
                                                  str(data), "--with-hits")),
                   Workload("perf script", (str(perf_bin), "script", "-i", str(data)))],
        build_cmd=["make", "-s", "-C", str(src / "tools" / "perf"), "-j2", f"O={build}",
                   *codebases.PERF_FLAGS])


def prepare(cb: Codebase) -> None:
    debian.install(PACKAGES)
    src = cb.source.parent.parent
    steps: dict[str, object] = {"packages": {"linux-source-6.1": debian.version(PACKAGES[0])}}
    if not (src / "Makefile").exists():
        cb.work.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        subprocess.run(["tar", "-xJf", str(TARBALL), "-C", str(cb.work)]
                       + [f"linux-source-6.1/{m}" for m in codebases.PERF_MEMBERS],
                       check=True)
        steps["extract_s"] = round(time.monotonic() - t, 1)
    marker = src / ".refcnt-stubs-applied"
    if not marker.exists():
        patch = HERE / "perf" / "refcnt-stubs-6.1.patch"
        subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=src, check=True)
        marker.write_text("benchmarks/mutants/perf/refcnt-stubs-6.1.patch\n")
    cb.build_dir.mkdir(parents=True, exist_ok=True)
    fresh = not (cb.build_dir / "perf").exists()
    steps["build_s" if fresh else "rebuild_check_s"] = cb.build()
    steps["build_command"] = " ".join(cb.build_cmd)
    data = cb.work / "work.data"
    if not data.exists():
        subprocess.run([str(cb.build_dir / "perf"), "record", "-q", "-g", "-F",
                        codebases.PERF_FREQ, "-o", str(data), "--", "sh", "-c",
                        codebases.PERF_RECORD], check=True, stdout=subprocess.DEVNULL)
    cb.prepared = steps


codebases.CODEBASES["perf61"] = (codebase, prepare, codebases.perf_probes)
