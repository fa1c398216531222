"""A corpus of real programs, each run unmodified under its bundled spec (issue 30).

Installs nothing (scripts/setup.sh does).  Each program of
benchmarks/corpus_programs.py runs under `refcntd run --spec SPEC --json F`;
each run is classified from that JSON: "refcntd error" (no JSON, a refcntd
exit status of 2 or a time-out), "INCOMPLETE" (tracing incomplete), "anomaly",
"leak" or "clean", in that order of precedence.  Against the truth
(corpus_programs.py's docstring) a run is right or a false finding.
GStreamer runs are also run without refcntd under its leaks tracer.

Usage (root): benchmarks/corpus.py [--smoke] [--out DIR] [--keep DIR] [--only FAMILY]
              [--reevaluate DIR [--as NAME]] [--compare EARLIER.json] [--no-leak-kinds]
              [--false-of OLD.json [--clean-sample N]]
--keep DIR keeps every refcntd JSON; --reevaluate DIR classifies the kept JSON
again with the specs as they are now (their kept_by_library rules applied
anew to the same stacks, as a live run applies them), without running.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus_programs as cp  # noqa: E402
from corpus_report import render_markdown  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFCNTD = [str(ROOT / ".venv/bin/refcntd")]
SMOKE = {"glib-tests": ["hash", "singleton"], "gio-tools": ["gio info /etc/passwd"],
         "virsh": ["virsh list --all"], "openssl": ["x509 -text"],
         "gstreamer": ["fakesrc num-buffers=200 ! fakesink"]}
ALIVE = re.compile(r"object-alive, type-name=\(string\)(\w+), address=\(gpointer\)(0x[0-9a-f]+)")


@dataclass
class Outcome:
    family: str
    name: str
    spec: str
    argv: list[str]
    truth: str
    cls: str = "clean"
    leaked: int = 0
    anomalies: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    command_status: int | None = None
    refcntd_status: int = 0
    seconds: float = 0.0
    truth_leaks: int | None = None  # gst-leaks: objects the leaks tracer lists alive
    false: bool = False
    findings: list[str] = field(default_factory=list)  # one line per leak group / anomaly
    error: str = ""
    nothing_loaded: bool = False  # refcntd's note: nothing of the spec's library was loaded


NO_LEAK_KINDS: list[str] = []  # --no-leak-kinds: every object alive at exit is a leak


def run_refcntd(p: cp.Program, env: dict[str, str], json_path: Path) -> tuple[int, str, float]:
    cmd = [*REFCNTD, "run", "--quiet", "--spec", p.spec, "--json", str(json_path),
           "--wait-descendants", "5", *NO_LEAK_KINDS, "--", *p.argv]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env={**os.environ, **env, **p.env}, cwd=env["TMPDIR"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=p.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate()
        return -1, f"timed out after {p.timeout_s} s", time.monotonic() - start
    return proc.returncode, err, time.monotonic() - start


def gst_truth(p: cp.Program, env: dict[str, str]) -> int:
    """Objects GStreamer's leaks tracer lists alive at gst_deinit, without refcntd."""
    tracer = {"GST_TRACERS": "leaks", "GST_DEBUG": "GST_TRACER:7", "GST_DEBUG_NO_COLOR": "1"}
    out = subprocess.run(p.argv, env={**os.environ, **env, **tracer}, cwd=env["TMPDIR"],
                         capture_output=True, text=True, timeout=p.timeout_s)
    return len(set(ALIVE.findall(out.stderr)))


def classify(o: Outcome, json_path: Path, status: int, err: str) -> None:
    """Fill o from refcntd's JSON (refcntd's own kept rules applied as the spec says now)."""
    from refcntd.analysis import kept
    from refcntd.inputs.spec import load_spec
    from refcntd.outputs.policy import LATE, REACHABLE
    from refcntd.outputs.runjson import load_run
    from refcntd.session.exitscan import NOT_SCANNED
    from refcntd.session.status import NOTHING_LOADED

    o.refcntd_status = status
    if status < 0 or status == 2 or not json_path.exists():
        o.cls, o.error = "refcntd error", (err.strip().splitlines() or ["no JSON"])[-1][:300]
        return
    result = load_run(str(json_path))
    rules = load_spec(o.spec).kept_by_library
    o.command_status = result.command_status
    o.leaked, o.kept, o.anomalies, o.findings = 0, {}, {}, []
    # judged as refcntd's default does (LeakSanitizer's), unless the exit scan could not be
    lsan = not NO_LEAK_KINDS and not any(n.startswith(NOT_SCANNED) for n in result.tracing.notes)
    for proc in result.processes:
        kept.set_aside(proc, rules)  # a no-op on a live run's own JSON with the same spec
        for reason, n in proc.kept.items():
            o.kept[reason] = o.kept.get(reason, 0) + n
        if proc.state == "live at detach":
            continue
        if lsan and (proc.exit_status.startswith("killed") or proc.direct_exit):
            proc.groups = []  # reported, not judged (killed, or _exit without exit())
        # still reachable, or made by threads still running after the scan: not judged
        proc.groups = [g for g in proc.groups if not (lsan and g.kind in (REACHABLE, LATE))]
        o.leaked += proc.leaked_objects
        who = proc.comm + ("" if proc.exit_status == "exit 0" else f", {proc.exit_status}")
        for g in proc.groups:
            kind = f" ({g.kind})" if lsan and g.kind else " (no kind)" if lsan else ""
            o.findings.append(f"[{who}] leak {len(g.objects)} {g.type_name}{kind} at "
                              f"{_where(g.frames)}")
        for a in proc.misuse:
            o.anomalies[a.kind] = o.anomalies.get(a.kind, 0) + a.occurrences
            o.findings.append(f"[{who}] {a.kind} {a.type_name} at {_where(a.frames)}"
                              f" (allocated at {_where(a.alloc_frames)})")
    o.lost = dict(result.tracing.lost)
    o.nothing_loaded = any(n.startswith(NOTHING_LOADED) for n in result.tracing.notes)
    o.cls = ("INCOMPLETE" if not result.tracing.complete else "anomaly" if o.anomalies
             else "leak" if o.leaked else "clean")


def _where(frames: Any, depth: int = 4) -> str:
    names = [f.function or f"{Path(f.module).name}+0x{f.vaddr:x}" for f in frames[:depth]]
    return " < ".join(names) or "(no stack)"


def judge(o: Outcome) -> None:
    from refcntd.session.run import NOTHING_FIRED

    if o.truth == "leak":  # a real leak (valgrind's evidence): it must fail as a leak
        o.false = o.cls != "leak"
    elif o.truth == "unaudited":  # no traced library loaded: refcntd must say so, and
        # since issue 54 that is a complete run with one note (before: INCOMPLETE)
        o.false = not (o.cls == "clean" and o.nothing_loaded
                       or o.cls == "INCOMPLETE" and set(o.lost) == {NOTHING_FIRED})
    elif o.truth == "gst-leaks":
        o.false = o.cls != "clean" and not (o.cls == "leak" and o.leaked == o.truth_leaks)
        o.false = o.false or (o.cls == "clean" and bool(o.truth_leaks))
    else:
        o.false = o.cls != "clean"


def run_one(p: cp.Program, env: dict[str, str], keep: Path, work: Path) -> Outcome:
    """One program under refcntd (and its peer); names and argv say $WORK for the work
    folder, so that runs compare from machine to machine."""
    o = Outcome(p.family, p.name.replace(str(work), "$WORK"), p.spec,
                [a.replace(str(work), "$WORK") for a in p.argv], p.truth)
    json_path = keep / f"{_slug(p.family, o.name)}.json"
    json_path.unlink(missing_ok=True)
    status, err, o.seconds = run_refcntd(p, env, json_path)
    classify(o, json_path, status, err)
    if p.truth == "gst-leaks":
        o.truth_leaks = gst_truth(p, env)
    judge(o)
    return o


def _slug(family: str, name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", f"{family}-{name}").strip("_")[:100]


def passing_glib_tests(env: dict[str, str], names: list[str]) -> list[str]:
    """GLib's installed tests that pass without refcntd (each once, as their .test says)."""
    ok = []
    for name in names:
        try:
            proc = subprocess.run(cp.glib_test_argv(name), env={**os.environ, **env},
                                  cwd=env["TMPDIR"], capture_output=True,
                                  timeout=cp.GLIB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            continue
        if proc.returncode == 0:
            ok.append(name)
    return ok


def session_bus(env: dict[str, str]) -> int:
    """A private D-Bus session bus for the run (GLib's tests are Type=session); its pid."""
    out = subprocess.run(["dbus-daemon", "--session", "--fork", "--print-address=1",
                          "--print-pid=1"], capture_output=True, text=True, check=True)
    address, pid = out.stdout.split()[:2]
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    return int(pid)


def programs(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[cp.Program]:
    names = cp.glib_test_names()
    if args.smoke:
        names = SMOKE["glib-tests"]
    wanted = None
    if args.false_of:
        runs = json.loads(args.false_of.read_text())["runs"]
        wanted = {(r["family"], r["name"]) for r in runs if r["false"]}
        clean = [(r["family"], r["name"]) for r in runs if r["cls"] == "clean" and not r["false"]]
        if args.clean_sample:
            wanted |= set(clean[::max(1, len(clean) // args.clean_sample)][:args.clean_sample])
        names = [n for n in names if ("glib-tests", n) in wanted]
    if args.only and "glib-tests" not in args.only:
        names = []
    progs = [*cp.glib_tests(passing_glib_tests(env, names), env), *cp.gio_tools(work),
             *cp.gstreamer(work), *cp.virsh(), *cp.openssl(work), *cp.cairo(work)]
    if args.smoke:
        progs = [p for p in progs if p.name in SMOKE.get(p.family, ())]
    if wanted is not None:  # names as the results spell them ($WORK)
        progs = [p for p in progs if (p.family, p.name.replace(str(work), "$WORK")) in wanted]
    return [p for p in progs if not args.only or p.family in args.only]


def machine() -> dict[str, Any]:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "?")
    return {"kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": round(mem, 1), "python": platform.python_version(),
            "os": _os_name(), "date": datetime.date.today().isoformat()}


def _os_name() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return "?"


def _head() -> str:
    """The commit whose specs classified the runs (+ if configs/specs has changes)."""
    git = ["git", "-C", str(ROOT)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "configs/specs"],
                           capture_output=True, text=True).stdout.strip()
    return rev + ("+" if dirty else "")


def reevaluate(keep: Path, old: dict[str, Any]) -> list[Outcome]:
    """The kept JSON classified again with the specs as they are now."""
    outcomes = []
    for row in old["runs"]:
        o = Outcome(row["family"], row["name"], row["spec"], row["argv"], row["truth"],
                    truth_leaks=row.get("truth_leaks"), seconds=row["seconds"])
        classify(o, keep / f"{_slug(o.family, o.name)}.json", row["refcntd_status"],
                 row.get("error", ""))
        judge(o)
        outcomes.append(o)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="about 7 fast programs")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    ap.add_argument("--name", default="corpus", help="results file stem (default corpus)")
    ap.add_argument("--keep", type=Path, help="keep every refcntd JSON in this folder")
    ap.add_argument("--only", action="append", help="only this family (repeatable)")
    ap.add_argument("--reevaluate", type=Path, help="classify DIR's kept JSON again")
    ap.add_argument("--compare", type=Path, help="an earlier results JSON: before/after tables")
    ap.add_argument("--as", dest="as_name", help="with --reevaluate: results file stem "
                    "(default NAME-reevaluated)")
    ap.add_argument("--no-leak-kinds", action="store_true", help="run with --no-leak-kinds: "
                    "every object alive at exit counts (the default judges as LeakSanitizer: "
                    "still reachable objects and killed processes do not); also to reevaluate "
                    "JSON of runs made without the exit scan")
    ap.add_argument("--false-of", type=Path, metavar="OLD.json",
                    help="only the runs that were false findings in this results file")
    ap.add_argument("--clean-sample", type=int, default=0, metavar="N",
                    help="with --false-of: also N of its clean runs, evenly spaced")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="RESULTS.json",
                    help="one results file of these (a family at a time, then reruns): "
                    "a later file's run replaces the same run of an earlier one")
    ap.add_argument("--retruth", action="store_true", help="with --merge: each run's truth "
                    "as corpus_programs.py says now (REAL_LEAKS, unaudited scripts), judged "
                    "again")
    args = ap.parse_args(argv)
    if args.no_leak_kinds:
        NO_LEAK_KINDS.append("--no-leak-kinds")
    if os.geteuid() != 0:
        print("corpus.py: run as root (refcntd needs it)", file=sys.stderr)
        return 2
    missing = cp.missing_tools()
    if missing:
        print(f"corpus.py: missing {', '.join(missing)}: run scripts/setup.sh", file=sys.stderr)
        return 2
    start = time.monotonic()
    doc: dict[str, Any] = {"machine": machine(), "smoke": args.smoke, "specs": _head()}
    if args.merge:
        doc = merged(args.merge)
        outcomes = [Outcome(**r) for r in doc["runs"]]
        if args.retruth:
            retruth(outcomes)
    elif args.reevaluate:
        old = json.loads((args.out / f"{args.name}.json").read_text())
        outcomes = reevaluate(args.reevaluate, old)
        args.name = args.as_name or f"{args.name}-reevaluated"
        doc.update(machine=old["machine"], smoke=old["smoke"], seconds=old["seconds"],
                   reevaluated=f"the JSON of the live run of {old['machine']['date']} "
                               f"(specs {old.get('specs', '?')})")
    else:
        outcomes = live(args)
        doc.update(seconds=round(time.monotonic() - start), reevaluated="")
    doc["runs"] = [asdict(o) for o in outcomes]
    doc["before"] = args.compare.name if args.compare else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    before = json.loads(args.compare.read_text()) if args.compare else None
    (args.out / f"{args.name}.md").write_text(render_markdown(doc, before=before))
    print(render_markdown(doc, table_only=True, before=before))
    return 0


def merged(files: list[Path]) -> dict[str, Any]:
    """The runs of several results files, in first-seen order; a later file's run
    replaces an earlier one's (the rerun of a false finding after a fix)."""
    docs = [json.loads(f.read_text()) for f in files]
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for d in docs:
        runs.update({(r["family"], r["name"]): r for r in d["runs"]})
    return {"machine": docs[0]["machine"], "smoke": False, "specs": docs[-1].get("specs"),
            "seconds": sum(d["seconds"] for d in docs),
            "reevaluated": "merged from " + ", then ".join(
                f"{f.name} (specs {d.get('specs', '?')}, {len(d['runs'])} runs)"
                for f, d in zip(files, docs, strict=True)), "runs": list(runs.values())}


def retruth(outcomes: list[Outcome]) -> None:
    """The truth of runs made before corpus_programs.py knew it: gio tools by
    REAL_LEAKS, the scripts that load no libglib by strace (run again here)."""
    with tempfile.TemporaryDirectory(prefix="refcntd-corpus-") as tmp:
        env = cp.session_env(Path(tmp))
        scripts = {p.name: p.truth for p in cp.glib_tests(
            [o.name for o in outcomes if o.family == "glib-tests" and o.name.endswith(".py")],
            env)}
    for o in outcomes:
        if o.family == "gio-tools":
            o.truth = "leak" if o.name in cp.REAL_LEAKS else "clean"
        o.truth = scripts.get(o.name, o.truth) if o.family == "glib-tests" else o.truth
        judge(o)


def live(args: argparse.Namespace) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="refcntd-corpus-") as tmp:
        work = Path(tmp)
        keep = args.keep or work / "json"
        keep.mkdir(parents=True, exist_ok=True)
        env = cp.session_env(work)
        cp.fixtures(work, env)
        bus = session_bus(env)
        try:
            outcomes = []
            for p in programs(args, work, env):
                o = run_one(p, env, keep, work)
                print(f"{o.family:<10} {o.cls:<13} {'FALSE' if o.false else 'ok':<5} "
                      f"{o.seconds:6.1f}s {o.name}", file=sys.stderr, flush=True)
                outcomes.append(o)
            return outcomes
        finally:
            os.kill(bus, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())
