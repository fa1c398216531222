"""GLib's installed tests as a CI maintainer runs them: every test under one spec
(`--spec gobject`), one line per test saying its verdict and why (issue 54, item 4).

The tests: the 49 of Debian's libglib2.0-tests that link libgobject and not libgio
(GObject's own tests), and `bytes`, `mainloop` and `private`, which link libglib only
and ended INCOMPLETE under the gobject spec before a run that had nothing of the spec's
library to count got its own verdict.  Each is run as its .test file says, under
`refcntd run --spec gobject --json`, with HOME, TMPDIR and XDG_RUNTIME_DIR in a work
folder (corpus_programs.session_env); a run's JSON already in --json-dir is judged again
instead (--rerun NAME runs it anew), its wall time read from NAME.seconds beside it.
Each verdict is checked: a clean run whose probes fired must account for every object
alive at exit (kept by GLib, still reachable); a run that says nothing of libgobject
was loaded is checked with `strace -f` on an untraced run of the same test (no process
of it opens libgobject).

Usage (root): benchmarks/glib_suite.py --json-dir DIR [--rerun NAME ...] [--out PAGE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import corpus_programs as cp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIBGLIB_ONLY = ["bytes", "mainloop", "private"]
TIMEOUT_S = 1800  # performance took 302 s at load 15, over 900 s at 26


def gobject_tests() -> list[str]:
    """The installed tests that link libgobject and not libgio."""
    names = []
    for name in cp.glib_test_names():
        argv = tuple(cp.glib_test_argv(name))
        if cp._is_elf(argv[0]) and cp._links(argv, cp.GOBJECT_LIB) \
                and not cp._links(argv, "libgio-2.0.so.0"):
            names.append(name)
    return names


def run(name: str, json_path: Path, env: dict[str, str]) -> tuple[int, str, float]:
    program = cp.Program("glib-tests", name, "gobject", tuple(cp.glib_test_argv(name)),
                         timeout_s=TIMEOUT_S)
    json_path.unlink(missing_ok=True)
    return corpus.run_refcntd(program, env, json_path)


def opens_gobject(name: str, env: dict[str, str]) -> bool | None:
    """Whether a process of an untraced run of the test opens libgobject (strace -f);
    None when strace did not finish in TIMEOUT_S."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        try:
            subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat", "-o", log.name,
                            *cp.glib_test_argv(name)], env={**os.environ, **env},
                           cwd=env["TMPDIR"], capture_output=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
        return any(cp.GOBJECT_LIB in line and "ENOENT" not in line for line in log)


def reason(o: corpus.Outcome, doc: dict[str, Any], env: dict[str, str]) -> tuple[str, bool]:
    """(the one-line reason for the verdict, whether the check agrees)."""
    if o.cls == "refcntd error":
        return o.error, False
    if o.cls == "INCOMPLETE":
        return "; ".join(o.lost), False
    if o.nothing_loaded:
        opened = opens_gobject(o.name, env)
        seen = {None: "did not finish", True: "opens libgobject (disagrees)",
                False: "no process opens it"}[opened]
        return f"nothing of libgobject was loaded; strace -f, untraced: {seen}", \
            opened is False
    hits: Counter[str] = Counter()
    for probe in doc["tracing"]["probes"]:
        hits[probe["role"]] += max(probe["hits"], 0)
    alive: Counter[str] = Counter()
    for process in doc["processes"]:
        for group in process["groups"]:
            alive[group.get("kind") or "no kind"] += len(group["instances"])
        for why, n in process["kept_by_library"].items():
            alive[f"kept by GLib ({why.split(' (')[0]})"] += n
    existing = sum(int(n.split()[0]) for n in doc["tracing"]["notes"]
                   if "constructors that returned an object already live" in n)
    made = f"{hits['init'] - existing} GObjects made, {hits['get']} refs, {hits['put']} " \
           f"unrefs, {hits['delete']} g_type_free_instance calls"
    if o.cls == "clean" and not any(hits.values()):
        return "libgobject mapped, none of the spec's functions called (its one note)", \
            any("never called the spec's functions" in n for n in doc["tracing"]["notes"])
    if o.cls == "clean":
        left = ", ".join(f"{n} {k}" for k, n in alive.items()) or "none"
        # a clean verdict: no leak judged, and every object alive at exit has a reason
        ok = all(k == "still reachable" or k.startswith("kept by GLib") for k in alive)
        return f"{made}; alive at exit: {left}", ok
    return f"{made}; " + "; ".join(o.findings[:2]), False


def judge(name: str, json_path: Path, status: int, err: str, seconds: float,
          env: dict[str, str]) -> tuple[corpus.Outcome, str, bool]:
    o = corpus.Outcome("glib-tests", name, "gobject", cp.glib_test_argv(name), "clean",
                       seconds=round(seconds, 1))
    corpus.classify(o, json_path, status, err)
    corpus.judge(o)
    doc = json.loads(json_path.read_text()) if json_path.exists() else {}
    why, ok = reason(o, doc, env)
    return o, why, ok


def page(rows: list[tuple[corpus.Outcome, str, bool]], machine: dict[str, Any]) -> str:
    classes = Counter(o.cls for o, _, _ in rows)
    checked = sum(ok for _, _, ok in rows)
    out = ["# GLib's installed tests under `--spec gobject` (issue 54, item 4)", "",
           f"Machine: {machine}", "",
           "`benchmarks/glib_suite.py`: each of the 49 tests of Debian's libglib2.0-tests "
           "(2.74.6) that link libgobject and not libgio, and `bytes`, `mainloop`, "
           "`private` (libglib only), run alone under `refcntd run --spec gobject`, as a "
           "CI maintainer running GLib's suite with one spec would.",
           "", f"**{len(rows)} tests: " + ", ".join(f"{n} {c}" for c, n in classes.items())
           + f"; {sum(len(o.anomalies) > 0 for o, _, _ in rows)} with an anomaly; "
           f"{checked} of {len(rows)} verdicts checked.**", "",
           "| test | verdict | refcntd s | reason (checked: ok) |", "|---|---|---|---|"]
    for o, why, ok in rows:
        out.append(f"| {o.name} | {o.cls} | {o.seconds} | {why} ({'ok' if ok else 'NOT ok'}) |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-dir", type=Path, required=True, help="each test's refcntd JSON")
    ap.add_argument("--rerun", action="append", default=[], help="run this test again")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/glib-suite.md")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("glib_suite.py: run as root (refcntd needs it)", file=sys.stderr)
        return 2
    args.json_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="refcntd-glib-suite-") as tmp:
        env = cp.session_env(Path(tmp))
        for name in gobject_tests() + LIBGLIB_ONLY:
            path = args.json_dir / f"{name}.json"
            took = path.with_suffix(".seconds")  # beside the JSON: the run's wall time
            status, err = 0, ""
            if name in args.rerun or not path.exists():
                status, err, seconds = run(name, path, env)
                took.write_text(f"{seconds:.1f}\n")
            seconds = float(took.read_text()) if took.exists() else 0.0
            rows.append(judge(name, path, status, err, seconds, env))
            o, why, ok = rows[-1]
            print(f"{o.cls:<13} {'ok' if ok else 'NOT':<4} {name}: {why}", file=sys.stderr,
                  flush=True)
    args.out.write_text(page(rows, corpus.machine()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
