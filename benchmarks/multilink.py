"""Attach and detach time of a target with many call sites: one BPF_TRACE_UPROBE_MULTI
link per file against one perf event (and link) per site.

    sudo .venv/bin/python benchmarks/multilink.py [--sites 100,500,2000] [--per-site-max 500]
                                                   [--out benchmarks/results]

Writes multilink.md and multilink.json into --out.  Each row attaches the plan's
probes through the real loader (refcntd.kernel.loader.Kernel), counts the bpf links
and perf events refcntd then holds (/proc/self/fd), and detaches.  Per-site detach
unregisters each uprobe alone (~0.2 s per site here), hence --per-site-max.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from run import EXAMPLES, machine, sh  # noqa: E402

from refcntd.binary.plan import build_plan  # noqa: E402
from refcntd.inputs.spec import load_spec  # noqa: E402
from refcntd.kernel.loader import Kernel  # noqa: E402
from refcntd.kernel.perf_uprobe import held_fds  # noqa: E402
from refcntd.kernel.program import KernelOptions  # noqa: E402
from refcntd.kernel.setup import prepare  # noqa: E402


def target(n: int, out: Path) -> Path:
    """A program calling the -O2 (lock-prefixed) get stub from n places."""
    stubs = out / "refcnt-O2.o"
    if not stubs.exists():
        sh(["gcc", "-O2", "-c", "-o", str(stubs), str(EXAMPLES / "refcnt.c")])
    src = out / f"sites-{n}.c"
    src.write_text('#include "refcnt.h"\nstruct obj { atomic_t refcnt; };\n'
                   "void many(struct obj *o)\n{\n" + "\trefcnt__get(o, refcnt);\n" * n +
                   "}\nint main(void) { return 0; }\n")
    exe = out / f"sites-{n}"
    sh(["gcc", "-O2", f"-I{EXAMPLES}", "-o", str(exe), str(src), str(stubs)])
    return exe


def measure(exe: Path, multi: bool) -> dict[str, Any]:
    plan = build_plan(load_spec("perf-stubs"), str(exe), {"*": "callsites"})
    kernel = Kernel(KernelOptions(filtered=True, has_delete=True), plan.sites, multi=multi)
    before = held_fds()
    try:
        t0 = time.monotonic()
        kernel.probes.attach_all()
        attach_s = time.monotonic() - t0
        held = {k: v - before[k] for k, v in held_fds().items()}
        assert not kernel.probes.failed_probes, kernel.probes.failed_probes[:3]
        assert not multi or not kernel.probes.multi_refused, kernel.probes.multi_refused
    finally:
        t0 = time.monotonic()
        kernel.detach()
        detach_s = time.monotonic() - t0
    return {"probes": len(plan.sites), "attach_s": attach_s, "detach_s": detach_s,
            "multi_links": kernel.probes.multi_links, "bpf_links": held["bpf_link"],
            "perf_events": held["[perf_event]"]}


def table(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    lines = ["# Attach and detach: multi-uprobe link vs one perf event per site", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()), "",
             "Target: the -O2 get stub (lock-prefixed entry) called from N places; "
             "`--probe-mode callsites` plan, attached through refcntd.kernel.loader.", "",
             "| call sites | probes | mode | attach | detach | bpf links held | "
             "perf events held |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['call_sites']} | {r['probes']} | {r['mode']} | "
                     f"{r['attach_s'] * 1e3:.1f} ms | {r['detach_s'] * 1e3:.1f} ms | "
                     f"{r['bpf_links']} | {r['perf_events']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", default="100,500,2000")
    ap.add_argument("--per-site-max", type=int, default=500)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    prepare()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sites.split(",")):
            exe = target(n, Path(tmp))
            for multi in (True, False) if n <= args.per_site_max else (True,):
                row = {"call_sites": n, "mode": "multi link" if multi else "per-site perf events",
                       **measure(exe, multi)}
                print(row, flush=True)
                rows.append(row)
    info = machine()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multilink.json").write_text(json.dumps({"machine": info, "rows": rows},
                                                        indent=1) + "\n")
    (args.out / "multilink.md").write_text(table(rows, info))
    print(table(rows, info))


if __name__ == "__main__":
    main()
