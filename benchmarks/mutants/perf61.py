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
from pathlib import Path

import codebases
from codebase import Codebase, Workload


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
    codebases.prepare_perf(cb, "6.1", "refcnt-stubs-6.1.patch")


codebases.CODEBASES["perf61"] = (codebase, prepare, codebases.perf_probes)
