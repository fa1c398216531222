"""Stack quality on real programs: the share of recorded stacks that reach main or a
thread start.

    sudo .venv/bin/python benchmarks/stackquality.py [--out DIR] [--only NAME]

Each corpus program runs under `refcntd run --spec SPEC` with
REFCNTD_DUMP_STACKS set, which appends every stack a reported process stored
(distinct stacks per process, raw) to a file.  Each stack is symbolized here
and counted as reaching the bottom when one of its frames is main, the C
library's start of main (__libc_start_call_main, __libc_start_main) or of a
thread (start_thread, clone3), or _start.  Also counted: how each stack that
does not reach it was cut (the kernel's truncation reason), and the report's
"stacks cut at a return address outside every executable mapping" note (one
per stack captured, not per distinct stack).  Writes results/stackquality.md
and results/stackquality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from refcntd.kernel.records import RawFrame  # noqa: E402
from refcntd.symbolize.symbolizer import BuildIdIndex, Symbolizer  # noqa: E402

REFCNTD = [sys.executable, "-m", "refcntd"]
BOTTOM = {"main", "_start", "__libc_start_main", "__libc_start_main_impl",
          "__libc_start_call_main", "start_thread", "clone3", "__clone3", "clone"}
CERT, KEY = "/tmp/refcntd-sq-cert.pem", "/tmp/refcntd-sq-key.pem"
SERVER = (f"openssl s_server -cert {CERT} -key {KEY} -accept {{port}} -naccept 1 "
          "-quiet {www} </dev/null >/dev/null 2>&1 & sleep 1; ")
CORPUS = {
    "openssl x509": ("openssl", ["openssl", "x509", "-in", CERT, "-noout", "-subject"]),
    "openssl s_server + s_client": ("openssl", ["sh", "-c", SERVER.format(port=14433, www="")
                                    + "openssl s_client -connect 127.0.0.1:14433 -quiet "
                                    "</dev/null >/dev/null 2>&1; wait"]),
    "curl (+ s_server -www)": ("openssl", ["sh", "-c", SERVER.format(port=14434, www="-www")
                               + "curl -sk https://127.0.0.1:14434/ >/dev/null; wait"]),
    "gio info": ("gobject", ["gio", "info", "/tmp"]),
    "gst-launch-1.0": ("gstreamer", ["gst-launch-1.0", "-q", "audiotestsrc", "num-buffers=10",
                                     "!", "fakesink"]),
}
CUT_NOTE = re.compile(r"(\d+) stacks cut at a return address outside every executable mapping")


def certificate() -> None:
    if not Path(CERT).exists():
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "30", "-subj", "/CN=t", "-keyout", KEY, "-out", CERT],
                       check=True, capture_output=True)


def measure(name: str, spec: str, command: list[str], work: Path, verbose: bool = False
            ) -> dict:
    dump, report = work / f"{name.split()[0]}-{len(name)}.stacks", work / "r.json"
    dump.unlink(missing_ok=True)
    run = subprocess.run([*REFCNTD, "run", "--spec", spec, "--json", str(report), "--",
                          *command], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env={**os.environ, "REFCNTD_DUMP_STACKS": str(dump)})
    notes = json.loads(report.read_text())["tracing"]["notes"] if report.exists() else []
    cut_note = sum(int(m[1]) for n in notes if (m := CUT_NOTE.search(n)))
    stacks = [json.loads(line) for line in dump.read_text().splitlines()] \
        if dump.exists() else []
    index = BuildIdIndex()
    for path in {"/usr/bin/" + command[0], *_programs(command)}:
        index.add(path)
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu/gstreamer-1.0",
              "/usr/lib/x86_64-linux-gnu/gio/modules", "/usr/bin"):
        index.add_search_dir(d)
    sym = Symbolizer(index)
    reached, why = 0, Counter()
    for st in stacks:
        frames = [RawFrame(b, off, tuple(f) if f else None, t) for b, off, f, t in st["frames"]]
        shown = [sym.frame(placed, "", i > 0) for i, placed in
                 enumerate(sym.place_frames(frames))]
        if {f.function for f in shown} & BOTTOM:
            reached += 1
            continue
        why[st["truncated"]] += 1
        if verbose:
            print(f"-- {st['truncated']} at {st['truncated_at']} ({st['method']})")
            for f, ip in zip(shown, st["ips"], strict=False):
                print(f"   {ip:#x} {f.module.rsplit('/', 1)[-1]} {f.function}+{f.offset:#x}")
    return {"stacks": len(stacks), "reach_main": reached,
            "share": round(reached / len(stacks), 3) if stacks else None,
            "not_reaching_by_reason": dict(why), "cut_outside_note": cut_note,
            "exit": run.returncode}


def _programs(command: list[str]) -> list[str]:
    words = " ".join(command).replace(";", " ").replace("&", " ").split()
    return [f"/usr/bin/{w}" for w in words if Path(f"/usr/bin/{w}").exists()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--only", help="one corpus entry (a prefix of its name)")
    ap.add_argument("--label", default="", help="a name for this run in the output")
    ap.add_argument("--verbose", action="store_true", help="print the stacks not reaching main")
    args = ap.parse_args()
    certificate()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (spec, command) in CORPUS.items():
            if args.only and not name.startswith(args.only):
                continue
            results[name] = measure(name, spec, command, Path(tmp), args.verbose)
            print(name, results[name], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.label}" if args.label else ""
    (args.out / f"stackquality{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| program (spec) | distinct stacks | reach main or a thread start | "
             "'cut outside' note |", "|---|---|---|---|"]
    for name, r in results.items():
        share = f"{r['reach_main']} ({100 * r['share']:.1f} %)" if r["share"] is not None else "-"
        lines.append(f"| {name} ({CORPUS[name][0]}) | {r['stacks']} | {share} | "
                     f"{r['cut_outside_note']} |")
    (args.out / f"stackquality{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
