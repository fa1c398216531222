"""CFI unwinding against the frame-pointer walk, and the cost of unwind tables.

    sudo .venv/bin/python benchmarks/unwind.py [--smoke] [--out DIR]

Rows: ns per init+release pair (an allocation stack per init) with the stack
8, 16 and 32 frames deep, for (a) a frame-pointer build walked by the
kernel's frame-pointer walk (REFCNTD_UNWIND=fp: what refcntd did before CFI),
(b) the same build walked by refcntd's unwinder (frame-pointer steps), and
(c) a -fomit-frame-pointer build walked with CFI tables.  Goal: (c) <= 2x (a).
Then the unwind tables of libc, libgobject and a ~100 MiB library (Debian's
libLLVM-14, installed with bcc): rows, kernel bytes, build time, cache size.
Writes results/unwind.md and results/unwind.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from run import machine  # noqa: E402

from refcntd.kernel.cfi import ROW, load_table  # noqa: E402

REFCNTD = [sys.executable, "-m", "refcntd"]
DEPTHS = (8, 16, 32)
TABLES = {"libc": "/usr/lib/x86_64-linux-gnu/libc.so.6",
          "libgobject": "/usr/lib/x86_64-linux-gnu/libgobject-2.0.so.0",
          "libLLVM-14 (~100 MiB)": "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1"}
VARIANTS = {"fp": ["-O2", "-fno-omit-frame-pointer"], "nofp": ["-O2", "-fomit-frame-pointer"]}


def build(out: Path) -> dict[str, Path]:
    exes = {}
    for name, flags in VARIANTS.items():
        exe = out / f"unwindbench-{name}"
        subprocess.run(["gcc", "-g", *flags, f"-I{ROOT / 'examples'}", "-o", str(exe),
                        str(HERE / "unwindbench.c"), str(ROOT / "examples" / "refcnt.c")],
                       check=True)
        exes[name] = exe
    return exes


def traced(exe: Path, depth: int, n: int, out: Path, env: dict[str, str]) -> dict:
    """One attach + run: ns per pair in the program, and the BPF programs' own time.

    With kernel.bpf_stats_enabled the kernel times each attached program
    (tail-called ones are inside on_probe's time): that is the walk's cost
    without the uprobe trap, which on this VM varies far more than the walk.
    """
    report = out / f"{exe.name}-{depth}.json"
    att = subprocess.Popen([*REFCNTD, "attach", "--binary", str(exe), "--json", str(report)],
                           stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                           cwd=ROOT, env={**os.environ, **env})
    try:
        for line in att.stderr:
            if "attached" in line:
                break
        ns = untraced(exe, depth, n)
        time.sleep(0.5)
        bpf_ns = bpf_time(att.pid)
    finally:
        att.send_signal(signal.SIGINT)
        att.communicate(timeout=300)
    group = next(g for p in json.loads(report.read_text())["processes"] for g in p["groups"])
    return {"ns": ns, "bpf_ns": bpf_ns / n, "frames": len(group["stack"]),
            "unwind": group["unwind"]}


def bpf_time(pid: int) -> float:
    """ns spent in on_probe (and the programs it tail-calls) of refcntd process `pid`."""
    names = {p["id"]: p.get("name", "") for p in json.loads(subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout)}
    total = 0
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        fields = dict(line.split(":", 1) for line in info.read_text().splitlines() if ":" in line)
        prog_id = int(fields.get("prog_id", "0"))
        if names.get(prog_id) == "on_probe":
            total += int(fields.get("run_time_ns", "0"))
    return float(total)


def untraced(exe: Path, depth: int, n: int) -> float:
    out = subprocess.run([str(exe), str(depth), str(n)], capture_output=True, text=True)
    return float(out.stdout.split()[1])


def stack_rows(exes: dict[str, Path], n: int, repeat: int, out: Path) -> list[dict]:
    cases = {"frame pointers, kernel walk (before CFI)": (exes["fp"], {"REFCNTD_UNWIND": "fp"}),
             "frame pointers, refcntd unwinder": (exes["fp"], {}),
             "no frame pointers, CFI": (exes["nofp"], {})}
    rows = []
    for depth in DEPTHS:
        plain = statistics.median(untraced(exes["nofp"], depth, n) for _ in range(repeat))
        for name, (exe, env) in cases.items():
            runs = [traced(exe, depth, n, out, env) for _ in range(repeat)]
            ns = statistics.median(r["ns"] for r in runs)
            bpf_ns = statistics.median(r["bpf_ns"] for r in runs)
            rows.append({"depth": depth, "case": name, "ns_per_pair": round(ns, 1),
                         "bpf_ns_per_pair": round(bpf_ns, 1),
                         "untraced_ns": round(plain, 1), "frames_reported": runs[0]["frames"],
                         "unwind": runs[0]["unwind"]})
    return rows


def table_rows(cache: Path, smoke: bool = False) -> list[dict]:
    rows = []
    for name, path in TABLES.items():
        if smoke and "LLVM" in name:
            continue  # seconds of table building: the full run measures it
        if not Path(path).exists():
            rows.append({"module": name, "path": path, "missing": True})
            continue
        started = time.monotonic()
        table = load_table(path, cache_dir=cache)
        built = time.monotonic() - started
        cached = next(cache.glob(f"{table.build_id.hex()}*.cfi"), None)
        started = time.monotonic()
        load_table(path, cache_dir=cache)
        reload_s = time.monotonic() - started
        rows.append({"module": name, "path": path,
                     "file_mib": round(os.path.getsize(path) / 2**20, 1), "rows": table.count,
                     "kernel_kib": round(table.count * ROW.size / 1024, 1),
                     "build_s": round(built, 2), "cached_load_s": round(reload_s, 3),
                     "cache_kib": round(cached.stat().st_size / 1024, 1) if cached else None,
                     "frame_pointers": table.has_frame_pointers})
    return rows


def render(results: dict) -> str:
    lines = ["# CFI unwinding vs the frame-pointer walk", "",
             f"Machine: {results['machine']}", "",
             "ns per init+release pair: in the program (uprobe traps included) and inside",
             "refcntd's BPF programs (kernel.bpf_stats_enabled: the walk, the store, the",
             "counting; tail calls included).", "",
             "| depth | case | ns per pair | BPF ns per pair | untraced ns | frames reported "
             "| how |", "|---|---|---|---|---|---|---|"]
    for r in results["stacks"]:
        how = r["unwind"].get("method", "") + (f", cut at {r['unwind']['truncated_at']}: "
                                                f"{r['unwind']['reason']}"
                                                if "truncated_at" in r["unwind"] else "")
        lines.append(f"| {r['depth']} | {r['case']} | {r['ns_per_pair']} | "
                     f"{r['bpf_ns_per_pair']} | {r['untraced_ns']} | {r['frames_reported']} "
                     f"| {how} |")
    lines += ["", "| depth | CFI / kernel frame-pointer walk, in the program | the same, BPF "
              "time only (goal <= 2) |", "|---|---|---|"]
    for depth, (whole, bpf) in results["ratios"].items():
        lines.append(f"| {depth} | {whole} | {bpf} |")
    lines += ["", "| module | file MiB | rows | kernel KiB | build s | cached load s | cache KiB "
              "| frame pointers |", "|---|---|---|---|---|---|---|---|"]
    for t in results["tables"]:
        if t.get("missing"):
            lines.append(f"| {t['module']} | not installed ({t['path']}) | | | | | | |")
            continue
        lines.append(f"| {t['module']} | {t['file_mib']} | {t['rows']} | {t['kernel_kib']} | "
                     f"{t['build_s']} | {t['cached_load_s']} | {t['cache_kib']} | "
                     f"{t['frame_pointers']} |")
    return "\n".join(lines) + "\n"


def ratios(rows: list[dict]) -> dict[int, tuple[float, float]]:
    """CFI / kernel frame-pointer walk: whole pair in the program, and BPF time only."""
    by = {(r["depth"], r["case"]): r for r in rows}
    out = {}
    for d in DEPTHS:
        cfi, fp = by[(d, "no frame pointers, CFI")], by[(d, "frame pointers, kernel walk "
                                                           "(before CFI)")]
        out[d] = (round(cfi["ns_per_pair"] / fp["ns_per_pair"], 2),
                  round(cfi["bpf_ns_per_pair"] / max(fp["bpf_ns_per_pair"], 1e-9), 2))
    return out


class bpf_stats:  # noqa: N801 - a context manager, named like one
    """kernel.bpf_stats_enabled on for the measurement, restored after."""

    PATH = Path("/proc/sys/kernel/bpf_stats_enabled")

    def __enter__(self) -> None:
        self.saved = self.PATH.read_text().strip()
        self.PATH.write_text("1")

    def __exit__(self, *exc: object) -> None:
        self.PATH.write_text(self.saved)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    parser.add_argument("--out", default=str(HERE / "results"), help="output directory")
    args = parser.parse_args()
    n, repeat = (2000, 1) if args.smoke else (50000, 3)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, bpf_stats():
        exes = build(Path(tmp))
        stacks = stack_rows(exes, n, repeat, Path(tmp))
        tables = table_rows(Path(tmp) / "cache", smoke=args.smoke)
    results = {"machine": machine(), "pairs": n, "repeat": repeat, "stacks": stacks,
               "ratios": ratios(stacks), "tables": tables}
    text = render(results)
    print(text)
    (out / "unwind.md").write_text(text)
    (out / "unwind.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
