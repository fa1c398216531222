"""Leak kinds (--leak-kinds, GET /leaks): stop time per GiB of heap, the exit scan's
cost on GLib tests, and the kinds against valgrind memcheck's.

    sudo .venv/bin/python benchmarks/leakkinds.py [--smoke] [--out DIR]

1. Stop time: benchmarks/heapfill.c makes a heap of N MiB in blocks of B bytes (one
   in 16 lost); the live scan (refcntd/service/leakscan.py:scan_live, as GET /leaks
   runs it) stops it, scans and continues it; the stop is timed.
2. The exit scan's cost: `refcntd run --spec gobject` with and without --leak-kinds
   (G_SLICE=always-malloc in both, so each GObject is its own block), wall time.
3. Kinds: the GObjects each run reports, by kind, against the kinds valgrind gives
   the blocks allocated under g_object_new in the same program (run with
   G_SLICE=always-malloc G_DEBUG=gc-friendly, as GLib advises).
Writes leak-kinds.md/.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from corpus import machine  # noqa: E402
from corpus_programs import glib_test_argv  # noqa: E402

from refcntd.reach import livecopy  # noqa: E402
from refcntd.service.leakscan import (  # noqa: E402
    estimate_s,
    expected_copy_s,
    scan_live,
    soft_dirty,
)

REFCNTD = [sys.executable, "-m", "refcntd"]
GLIB_TESTS = ["cancellable", "defaultiface", "dynamictests", "dynamictype", "testing", "task"]
GIO_TOOLS = [["gio", "mime", "text/plain"], ["gio", "list", "/usr/share"]]
HEAPS = [(mib, block) for mib in (64, 256, 1024) for block in (64, 1024, 4096)]
GOALS = {"exit_scan_overhead": 0.20, "stop_s_per_gib": 0.15,
         "soft_dirty_stop_s_per_gib_5_percent": 0.020}
RECORD = re.compile(r"==\d+== ([\d,]+) (?:\([\d,]+ direct, [\d,]+ indirect\) )?bytes in (\d+) "
                    r"blocks are (still reachable|definitely lost|indirectly lost|possibly lost)"
                    r" in loss record[^\n]*\n((?:==\d+==    [^\n]*\n)*)")


WAYS = ("copy", "stopped")  # GET /leaks: copied in the stop, or scanned while stopped
COPY_GOAL_S_PER_GIB, SOFT_DIRTY_GOAL_S = 0.15, 0.020  # issue 57


def stop_time(exe: Path, mib: int, block: int, how: str = "copy", dirty: float = 0.0,
              thp: bool = False) -> dict[str, object]:
    """One live scan of heapfill, `how`: "copy" (the stop copies the memory), "stopped"
    (scanned while stopped, as before issue 57) or "soft-dirty" (copied while it runs,
    then the pages written since); `dirty`: the share of pages heapfill keeps writing;
    `thp`: its heap in transparent huge pages (glibc.malloc.hugetlb=1)."""
    env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=1") if thp else None
    proc = subprocess.Popen([str(exe), str(mib), str(block), *([str(dirty)] if dirty else [])],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        blocks = int(proc.stdout.readline().split()[1])
        huge_kib = _anon_huge_kib(proc.pid)
        began = time.monotonic()
        estimate = estimate_s(proc.pid)[0] if how == "stopped" else \
            expected_copy_s(livecopy.copy_size(proc.pid))
        estimated_in = time.monotonic() - began
        cpu, began = time.process_time(), time.monotonic()
        live = scan_live(proc.pid, budget_s=1e9,
                         copy_limit=0 if how == "stopped" else livecopy.LIMIT,
                         pre_copy=how == "soft-dirty")
        cpu, took = time.process_time() - cpu, time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()
    assert live.scan is not None and live.scan.complete, live.skipped
    assert live.how == how, (live.how, live.why)
    heap = live.scan.heap_bytes
    return {"mib": mib, "block": block, "how": how, "dirty_percent": dirty, "thp": thp,
            "anon_huge_kib": huge_kib, "blocks": blocks, "scanned_blocks": live.scan.blocks,
            "lost_blocks": live.scan.lost_blocks, "heap_gib": heap / 2**30,
            "bytes_read": live.scan.bytes_read, "recopied_bytes": live.recopied_bytes,
            "stopped_s": live.stopped_s,
            "estimate_s": estimate, "load_average": os.getloadavg()[0], "cpu_s": cpu,
            "after_s": max(took - live.stopped_s - estimated_in, 0.0),
            "s_per_gib": live.stopped_s / (heap / 2**30)}


def _anon_huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def heap_rows(exe: Path, heaps: list[tuple[int, int]], runs: int, soft_dirty: bool,
              dirty: float, only: list[str]) -> list[dict[str, object]]:
    """Each heap each way, the ways alternated (the load drifts), `runs` times; with
    soft-dirty pages, that way too, heapfill writing `dirty` % of its pages, with and
    without transparent huge pages.  `only`: those ways (each row printed as it ends:
    farm-bench pairs keep it in a file)."""
    ways = [(how, 0.0, False) for how in WAYS]
    if soft_dirty:
        ways += [("copy", dirty, False), ("soft-dirty", dirty, False),
                 ("soft-dirty", dirty, True)]
    rows = []
    for mib, block in heaps:
        for _ in range(runs):
            for how, d, thp in ways:
                if not only or how in only:
                    rows.append(stop_time(exe, mib, block, how, d, thp))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def traced(argv: list[str], kinds: bool, out: Path) -> tuple[float, dict[str, object]]:
    env = {**os.environ, "G_SLICE": "always-malloc"}
    report = out / "r.json"
    began = time.monotonic()
    subprocess.run([*REFCNTD, "run", "--spec", "gobject", "--json", str(report), "--quiet",
                    "--leak-kinds" if kinds else "--no-leak-kinds", "--", *argv], cwd=ROOT, env=env,
                   capture_output=True, timeout=600)
    took = time.monotonic() - began
    return took, json.loads(report.read_text())


def refcntd_kinds(run: dict[str, object]) -> Counter[str]:
    return Counter(g.get("kind", "") for p in run["processes"] for g in p["groups"]  # type: ignore[attr-defined,index]
                   for _ in g["instances"])


PRIVATE_LIBS = ["libglib-2.0.so.0", "libgobject-2.0.so.0", "libgio-2.0.so.0",
                "libgmodule-2.0.so.0", "libc.so.6"]


def private_copies(tmp: Path) -> Path:
    """ld.so, libc and GLib's libraries copied: valgrind runs code from memory, and a uprobe's
    int3 in the system's files (any refcntd tracing GLib on this machine, even for
    another process) would SIGTRAP it; a copy is another inode, never probed."""
    libs = tmp / "private"
    if not libs.exists():
        libs.mkdir()
        shutil.copy("/lib64/ld-linux-x86-64.so.2", libs / "ld.so")
        for name in PRIVATE_LIBS:
            shutil.copy(Path("/usr/lib/x86_64-linux-gnu") / name, libs / name)
    return libs


def valgrind_kinds(argv: list[str], libs: Path) -> Counter[str]:
    env = {**os.environ, "G_SLICE": "always-malloc", "G_DEBUG": "gc-friendly",
           "LD_LIBRARY_PATH": str(libs)}
    loader = libs / "ld.so"
    exe = shutil.which(argv[0]) or argv[0]
    proc = subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all",
                           "--num-callers=40", str(loader), exe, *argv[1:]], env=env,
                          capture_output=True, text=True, timeout=900)
    assert "LEAK SUMMARY" in proc.stderr and "signal 5 (SIGTRAP)" not in proc.stderr, \
        proc.stderr[-2000:]
    out: Counter[str] = Counter()
    for m in RECORD.finditer(proc.stderr):
        if re.search(r"g_object_new\b|g_object_new_with_properties|g_object_newv", m.group(4)) \
                and "g_type_create_instance" in m.group(4):
            out["still reachable" if m.group(3) == "possibly lost" else m.group(3)] += \
                int(m.group(2))
    return out


def program_row(name: str, argv: list[str], runs: int, tmp: Path,
                valgrind: bool = True) -> dict[str, object]:
    plain = [traced(argv, False, tmp)[0] for _ in range(runs)]
    with_kinds = [traced(argv, True, tmp) for _ in range(runs)]
    ours = refcntd_kinds(with_kinds[-1][1])
    theirs = valgrind_kinds(argv, private_copies(tmp)) if valgrind else Counter[str]()
    base, scanned = statistics.median(plain), statistics.median(t for t, _ in with_kinds)
    notes = " ".join(with_kinds[-1][1]["tracing"]["notes"])  # type: ignore[index]
    held = re.search(r"held ([\d.]+) s in total", notes)
    return {"program": name, "traced_s": base, "with_kinds_s": scanned,
            "held_s": float(held.group(1)) if held else None, "load_average": os.getloadavg()[0],
            "overhead": scanned / base - 1, "refcntd": dict(ours), "valgrind": dict(theirs),
            "equal": ours == theirs, "same_kinds": set(ours) <= set(theirs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=["heaps", "programs"],
                        help="only the stop times, or only the programs")
    parser.add_argument("--no-valgrind", action="store_true",
                        help="programs without valgrind's column (its kinds were compared "
                             "before; the exit scan's cost alone)")
    parser.add_argument("--revalgrind", action="store_true",
                        help="only valgrind's side again, on the rows of OUT/leak-kinds.json")
    parser.add_argument("--heap", action="append", default=[], metavar="MIBxBYTES",
                        help="heaps to stop (default: 64, 256, 1024 MiB x 64, 1024, 4096)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each heap and way")
    parser.add_argument("--way", action="append", default=[], choices=[*WAYS, "soft-dirty"],
                        help="only these ways (default: each, soft-dirty where the kernel has it)")
    parser.add_argument("--dirty", type=float, default=5.0,
                        help="with soft-dirty pages: the %% of pages written during the scan")
    args = parser.parse_args()
    if args.revalgrind:
        return revalgrind(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "heapfill"
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), str(HERE / "heapfill.c")],
                       check=True)
        chosen = [tuple(int(n) for n in h.split("x")) for h in args.heap] or HEAPS
        heaps = [] if args.only == "programs" else heap_rows(
            exe, [(16, 64)] if args.smoke else chosen, args.runs, soft_dirty(), args.dirty,
            args.way)
        programs = [(t, glib_test_argv(t)) for t in GLIB_TESTS[:1 if args.smoke else None]]
        programs += [] if args.smoke else [(" ".join(a), a) for a in GIO_TOOLS]
        programs = [] if args.only == "heaps" else programs
        rows = [program_row(n, a, 1 if args.smoke else 2, Path(tmp), not args.no_valgrind)
                for n, a in programs]
    if args.only:  # the other half as the results file has it
        old = json.loads((args.out / "leak-kinds.json").read_text())
        heaps, rows = heaps or old["heaps"], rows or old["programs"]
    write(args.out, heaps, rows)
    return 0


def revalgrind(out: Path) -> int:
    data = json.loads((out / "leak-kinds.json").read_text())
    argv = {t: glib_test_argv(t) for t in GLIB_TESTS} | {" ".join(a): a for a in GIO_TOOLS}
    with tempfile.TemporaryDirectory() as tmp:
        for row in data["programs"]:
            theirs = valgrind_kinds(argv[row["program"]], private_copies(Path(tmp)))
            row["valgrind"] = dict(theirs)
            ours = Counter(row["refcntd"])
            row["equal"], row["same_kinds"] = ours == theirs, set(ours) <= set(theirs)
    write(out, data["heaps"], data["programs"])
    return 0


def write(out: Path, heaps: list[dict[str, object]], rows: list[dict[str, object]]) -> None:
    data = {"machine": machine(), "load_average": os.getloadavg(), "heaps": heaps,
            "programs": rows, "goals": GOALS}
    out.mkdir(parents=True, exist_ok=True)
    (out / "leak-kinds.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Leak kinds: stop time, exit-scan cost, kinds against valgrind", "",
             f"Machine: {data['machine']}; load average at the end "
             f"{os.getloadavg()[0]:.1f} on 2 CPUs (other sessions ran beside it)", "",
             "`benchmarks/leakkinds.py`.", "",
             "## Stop time of a live scan (GET /leaks) per GiB of heap", "",
             f"Commit {_commit()}. Way: `copy` (issue 57: the stop copies the writable "
             "memory, the scan reads the copy once the process runs), `stopped` (scanned "
             "while stopped, as before), `soft-dirty` (copied while it runs, then in the "
             "stop only the pages written since; heapfill writing `dirty %` of its pages, "
             "THP: its heap in transparent huge pages). Goals: "
             f"{GOALS['stop_s_per_gib']} s per GiB; {GOALS['soft_dirty_stop_s_per_gib_5_percent']}"
             " s for 1 GiB with soft-dirty pages and < 5 % of pages written.", "",
             "| heap MiB | block bytes | way | dirty % | THP (AnonHugePages MiB) | blocks "
             "| lost blocks | copied MiB | of it in the stop MiB | stopped s "
             "| s per GiB of heap | estimated s | refcntd's CPU s | graph after the stop s "
             "| load average |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {h['mib']} | {h['block']} | {h.get('how', 'stopped')} | "
              f"{h.get('dirty_percent', 0):g} | "
              f"{'yes' if h.get('thp') else 'no'} ({int(h.get('anon_huge_kib', 0)) // 1024}) | "  # type: ignore[call-overload]
              f"{h['scanned_blocks']:,} | {h['lost_blocks']:,} | "
              f"{int(h['bytes_read']) / 2**20:.0f} | "  # type: ignore[call-overload]
              f"{_in_stop(h) / 2**20:.1f} | {h['stopped_s']:.3f} | "
              f"{h['s_per_gib']:.3f} | {h['estimate_s']:.2f} | "
              f"{h.get('cpu_s', float('nan')):.2f} | {h.get('after_s', float('nan')):.2f} | "
              f"{h.get('load_average', float('nan')):.1f} |" for h in heaps]
    lines += ["", "## GLib tests and gio tools: cost of the exit scan, kinds against valgrind",
              "", "GObjects made by g_object_new alive at exit: refcntd's kind of each, and "
              "valgrind's kind of each block allocated under g_object_new (possibly lost "
              "counted as still reachable: reached through an interior pointer). valgrind "
              "also counts instances the spec does not follow (made by g_object_new inside "
              "GLib's own libraries in call-site mode) and runs the program again (timing, "
              "its own malloc): the runs are compared by kinds and counts, not object by "
              "object. Object by object, against valgrind on the same binary: "
              "tests/bpf/test_leak_kinds.py (14 of 14 equal).", "",
              "| program | traced s (--no-leak-kinds) | with leak kinds s | overhead | "
              "held at exit s | "
              "refcntd | valgrind | refcntd's kinds among valgrind's | same counts |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['program']} | {r['traced_s']:.2f} | {r['with_kinds_s']:.2f} | "
              f"{float(r['overhead']):+.0%} | "  # type: ignore[arg-type]
              f"{'-' if r.get('held_s') is None else format(r['held_s'], '.3f')} | "
              f"{_kinds(r['refcntd'])} | "
              f"{_kinds(r['valgrind'])} | {'yes' if r['same_kinds'] else '**no**'} | "
              f"{'yes' if r['equal'] else 'no'} |" for r in rows]
    md = out / "leak-kinds.md"
    by_hand = md.read_text().partition("\n## Reading")[2] if md.exists() else ""
    md.write_text("\n".join(lines) + "\n" + (f"\n## Reading{by_hand}" if by_hand else ""))


def _in_stop(row: dict[str, object]) -> int:
    """Bytes copied (or read) while the process was stopped."""
    return int(row["recopied_bytes"] if row.get("how") == "soft-dirty"  # type: ignore[call-overload]
               else row["bytes_read"])


def _commit() -> str:
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "refcntd"],
                           capture_output=True, text=True).stdout.strip()
    return rev + ("+" if dirty else "")


def _kinds(counts: object) -> str:
    return ", ".join(f"{n} {k or 'no kind'}" for k, n in sorted(counts.items())) or "none"  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
