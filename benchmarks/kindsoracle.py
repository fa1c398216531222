"""Leak kinds against valgrind memcheck, object by object where the programs allow it
(issue #42's truth): writes results/leak-kinds-valgrind.md/.json.

    sudo .venv/bin/python benchmarks/kindsoracle.py [--out DIR] [--only NAME ...]

1. tests/fixtures/reach.c (-O2, no frame pointers): each object has a block size no
   other block has, so valgrind's loss records name it; one row per object.
2. GLib's installed tests and gio tools that the corpus flagged: `refcntd run --spec
   gobject` (leak kinds, the default) and valgrind (`--leak-check=full
   --show-leak-kinds=all`, through private copies of ld.so, libc and GLib) on the
   same command.  Addresses differ between the two runs, so objects are matched by
   their allocation site: the two frames after g_object_new*, a frame without a
   name reduced to its module.  valgrind lists every block allocated under
   g_type_create_instance, also objects the spec does not follow (made inside
   GLib's libraries); a site is equal when the kinds refcntd gives its objects are
   the kinds valgrind gives as many of that site's blocks.  Objects refcntd calls
   `created after the scan` (made by threads that ran on after the exit scan) are
   shown and not compared: no leak checker sees them.  Only the command's own
   process is compared: valgrind does not follow the subprocesses a test spawns.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "bpf"))

from corpus import machine  # noqa: E402
from corpus_programs import glib_test_argv  # noqa: E402
from leakkinds import RECORD, REFCNTD, private_copies  # noqa: E402
from reachtruth import fixture_objects, lsan_kind, private_loader  # noqa: E402
from reachtruth import valgrind_kinds as valgrind_by_size  # noqa: E402

PROGRAMS = {"cancellable": glib_test_argv("cancellable"),
            "gdbus-close-pending": glib_test_argv("gdbus-close-pending"),
            "gdbus-proxy-unique-name": glib_test_argv("gdbus-proxy-unique-name"),
            "gio list /usr/share": ["gio", "list", "/usr/share"],
            "gio tree /usr/share/glib-2.0": ["gio", "tree", "/usr/share/glib-2.0"],
            "gio mime text/plain": ["gio", "mime", "text/plain"],
            "task": glib_test_argv("task"),
            "gio info /usr/share/glib-2.0": ["gio", "info", "/usr/share/glib-2.0"],
            "gio cat /etc/os-release": ["gio", "cat", "/etc/os-release"]}
VALGRIND_OPTS: list[str] = []  # --valgrind-opt: e.g. --freelist-vol=0 (the quarantine off)
REFCNTD_G_SLICE = ["always-malloc"]  # --gslice: "" (GLib's slabs, read by reach/gslice.py)
LATE = "created after the scan"  # refcntd's kind for what no checker sees: not compared
CONSTRUCTOR = re.compile(r"^g_object_new(_valist|_with_properties|v|_internal)?$")
VG_FRAME = re.compile(r"(?:at|by) 0x([0-9A-F]+): (\S+) \((?:in )?([^)]*)\)")
# Under valgrind, GLib marks an instance with private data as two blocks, the
# instance (the first client request in g_type_create_instance) and its private part
INSTANCE_REQUEST = re.compile(r"   at 0x([0-9A-F]+): g_type_create_instance ")
ALLOCATORS = {"malloc", "calloc", "realloc", "g_malloc", "g_malloc0", "g_malloc_n",
              "g_malloc0_n", "g_slice_alloc", "g_slice_alloc0"}
BASE = re.compile(r"\s+\[0\]\s+avma (0x[0-9a-f]+)\s+size \d+\s+foff 0\s")
SITE_FRAMES = 2


def refcntd_json(argv: list[str], out: Path, spec: list[str]) -> dict:  # type: ignore[type-arg]
    env = {**os.environ, "G_SLICE": REFCNTD_G_SLICE[0]}
    report = out / "r.json"
    proc = subprocess.run([*REFCNTD, "run", *spec, "--json", str(report), "--", *argv],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert report.exists(), proc.stderr[-2000:]
    data: dict = json.loads(report.read_text())  # type: ignore[type-arg]
    data["_stdout"], data["_stderr"] = proc.stdout, proc.stderr
    return data


def fixture_rows(tmp: Path) -> list[dict[str, object]]:
    """One row per object of reach.c: refcntd's kind and valgrind's."""
    sources = [str(ROOT / "tests/fixtures/reach.c"), str(ROOT / "examples/refcnt.c")]
    flags = ["-g", f"-I{ROOT / 'examples'}", "-O2", "-fomit-frame-pointer", "-pthread"]
    exe, vg = tmp / "reach", tmp / "reach-vg"
    subprocess.run(["gcc", "-o", str(exe), *sources, *flags], check=True)
    subprocess.run(["gcc", "-o", str(vg), *sources, *flags, *private_loader(tmp)], check=True)
    truth = valgrind_by_size([str(vg), "exit"])
    run = refcntd_json([str(exe), "exit"], tmp, [])
    found = {int(i["address"], 16): i for p in run["processes"] for g in p["groups"]
             for i in g["instances"]}
    rows = []
    for address, (name, size) in sorted(fixture_objects(run["_stdout"]).items(),
                                        key=lambda o: o[1][0]):
        ours = found.get(address, {}).get("kind", "not listed")
        theirs = truth.get(size, ["none"])
        rows.append({"object": name, "refcntd": ours, "valgrind": ", ".join(theirs),
                     "equal": [ours] == [lsan_kind(k) for k in theirs]})
    return rows


def _module(path: str) -> str:
    """A module's name as both sides spell it: libgio-2.0.so.0.7400.6 and the private
    copy libgio-2.0.so.0 are both libgio-2.0.so."""
    name = Path(path).name
    return name.split(".so")[0] + ".so" if ".so" in name else name


def _site(frames: list[tuple[str, str]]) -> tuple[str, ...]:
    """The frames after the constructor: (function or "", module) pairs from the top."""
    names = [f for f, _ in frames]
    last = max((i for i, f in enumerate(names) if CONSTRUCTOR.match(f)), default=-1)
    if last < 0:
        return ()
    after = frames[last + 1:last + 1 + SITE_FRAMES]
    return tuple(f or _module(m) for f, m in after)


def refcntd_sites(run: dict, argv: list[str]  # type: ignore[type-arg]
                  ) -> dict[tuple[str, ...], Counter[str]]:
    """The command's own process only: valgrind (without --trace-children) does not
    follow the subprocesses a test spawns (GLib's g_test_trap_subprocess), refcntd
    does."""
    out: dict[tuple[str, ...], Counter[str]] = {}
    for p in run["processes"]:
        command = p.get("command") or [""]
        if Path(command[0]).name != Path(argv[0]).name or command[1:] != argv[1:]:
            continue
        for g in p["groups"]:
            site = _site([(f.get("function") or f"{_module(f['module'])}+{f['address']}",
                           f["module"]) for f in g["stack"]])
            for i in g["instances"]:
                out.setdefault(site, Counter())[i.get("kind", "no kind")] += 1
    return out


def valgrind_sites(argv: list[str], libs: Path) -> dict[tuple[str, ...], Counter[str]]:
    """valgrind's kinds of the blocks allocated under g_type_create_instance, by site.
    Its symbol-table trace gives each module's load address, so that a frame without a
    name becomes module+offset as refcntd writes it (valgrind prints a return address
    less one)."""
    env = {**os.environ, "G_SLICE": "always-malloc", "G_DEBUG": "gc-friendly",
           "LD_LIBRARY_PATH": str(libs)}
    exe = shutil.which(argv[0]) or argv[0]
    log = libs.parent / "valgrind.txt"
    with log.open("w") as err:
        subprocess.run(["valgrind", "--leak-check=full", "--show-leak-kinds=all", *VALGRIND_OPTS,
                        "--num-callers=40", "--trace-symtab=yes", "--trace-symtab-patt=*g*",
                        str(libs / "ld.so"), exe, *argv[1:]], env=env, stdout=subprocess.DEVNULL,
                       stderr=err, timeout=1800)
    bases, text = _bases_and_records(log)
    assert "LEAK SUMMARY" in text and "signal 5 (SIGTRAP)" not in text, text[-2000:]
    out: dict[tuple[str, ...], Counter[str]] = {}
    requests = [int(a, 16) for a in INSTANCE_REQUEST.findall(text)]
    for m in RECORD.finditer(text):
        found = VG_FRAME.findall(m.group(4))
        if not _instance_block([f for _, f, _ in found], int(found[0][0], 16), requests):
            continue
        frames = [(f if f != "???" else _offset(int(a, 16) + 1, m_, bases), m_)
                  for a, f, m_ in found]
        out.setdefault(_site(frames), Counter())[lsan_kind(m.group(3))] += int(m.group(2))
    return out


def _instance_block(names: list[str], top: int, requests: list[int]) -> bool:
    """A block that is an instance: allocated by g_type_create_instance through the
    allocators only (not by an instance's init it calls), or, under valgrind, its first
    client request (the second is the instance's private data)."""
    if "g_type_create_instance" not in names:
        return False
    first = names.index("g_type_create_instance")
    if first == 0:
        return top == min(requests)
    return all(n in ALLOCATORS for n in names[:first])


def _bases_and_records(log: Path) -> tuple[dict[str, int], str]:
    """Each traced module's load address (its first mapping, file offset 0), and the
    log's lines of valgrind's own report."""
    bases: dict[str, int] = {}
    name, report = "", []
    with log.open(errors="replace") as lines:
        for line in lines:
            if line.startswith("=="):
                report.append(line)
            elif line.startswith("------") and " name = " in line:
                name = line.split(" name = ", 1)[1].strip()
            elif found := BASE.match(line):
                bases.setdefault(name, int(found.group(1), 16))
    return bases, "".join(report)


def _offset(address: int, module: str, bases: dict[str, int]) -> str:
    base = bases.get(module)
    return f"{_module(module)}+0x{address - base:x}" if base is not None else ""


def program_rows(name: str, argv: list[str], tmp: Path) -> list[dict[str, object]]:
    """Per allocation site of the objects refcntd lists: both sides' kinds."""
    run = refcntd_json(argv, tmp, ["--spec", "gobject"])
    ours, theirs = refcntd_sites(run, argv), valgrind_sites(argv, private_copies(tmp))
    return [{"program": name, "site": " < ".join(site) or "?", "refcntd": dict(kinds),
             "valgrind": dict(theirs.get(site, Counter())),
             "equal": all(theirs.get(site, Counter())[k] >= n for k, n in kinds.items()
                          if k != LATE)}
            for site, kinds in sorted(ours.items())] or \
        [{"program": name, "site": "(no object alive at exit)", "refcntd": {},
          "valgrind": {}, "equal": True}]


def repeated_rows(name: str, argv: list[str], tmp: Path, runs: int) -> list[dict[str, object]]:
    """Both tools `runs` times on one command (which objects are alive at exit
    depends on when GIO's worker thread finishes its tasks: valgrind runs the
    program 20-50x slower)."""
    ours, theirs = [], []
    libs = private_copies(tmp)
    for i in range(runs):
        work = tmp / f"run{i}"
        work.mkdir(exist_ok=True)
        ours.append(refcntd_sites(refcntd_json(argv, work, ["--spec", "gobject"]), argv))
        theirs.append(valgrind_sites(argv, libs))
    return compare_runs(name, ours, theirs)


def compare_runs(name: str, ours: list[dict[tuple[str, ...], Counter[str]]],
                 theirs: list[dict[tuple[str, ...], Counter[str]]]) -> list[dict[str, object]]:
    """Per site refcntd listed in any run: each run's kinds on both sides, and a verdict.
    `same kinds`: every kind refcntd gave is one valgrind gave at that site in some
    run; `alive only under refcntd`: valgrind had no instance block there in any run
    (its slower run let the object go before exit: no verdict to compare); `differ`:
    valgrind had blocks there, and refcntd gave a kind valgrind never did."""
    rows: list[dict[str, object]] = []
    for site in sorted({s for run in ours for s in run}):
        mine = [dict(run.get(site, Counter())) for run in ours]
        other = [dict(run.get(site, Counter())) for run in theirs]
        kinds = {k for run in mine for k in run if k != LATE}
        seen = {k for run in other for k in run}
        verdict = ("same kinds" if kinds <= seen else
                   "alive only under refcntd" if not seen else "differ")
        rows.append({"program": name, "site": " < ".join(site) or "?", "refcntd": mine,
                     "valgrind": other, "verdict": verdict,
                     "only_refcntd": sorted(kinds - seen)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", nargs="*", help="program names (default: all, and reach.c)")
    parser.add_argument("--valgrind-opt", action="append", default=[], metavar="OPT",
                        help="one more valgrind option (repeatable); its rows are named "
                             "PROGRAM (valgrind OPT)")
    parser.add_argument("--repeat", type=int, default=0, metavar="N",
                        help="run each --only program N times in both tools and write "
                             "the per-site kinds of every run (section 'Repeated runs')")
    parser.add_argument("--gslice", action="store_true",
                        help="refcntd's runs with G_SLICE= (GLib's slabs; valgrind's stay "
                             "always-malloc); rows named PROGRAM (GSlice)")
    args = parser.parse_args()
    VALGRIND_OPTS.extend(args.valgrind_opt)
    suffix = f" (valgrind {' '.join(args.valgrind_opt)})" if args.valgrind_opt else ""
    if args.gslice:
        REFCNTD_G_SLICE[0] = ""
        suffix += " (GSlice)"
    if args.repeat:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [r for n in args.only or PROGRAMS
                    for r in repeated_rows(n + suffix, PROGRAMS[n], Path(tmp), args.repeat)]
        write(args.out, [], [], rows)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = [] if args.only else fixture_rows(Path(tmp))
        programs = [r for n, a in PROGRAMS.items() if not args.only or n in args.only
                    for r in program_rows(n + suffix, a, Path(tmp))]
    write(args.out, fixtures, programs)
    return 0


def _kinds(counts: object) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"  # type: ignore[attr-defined]


def write(out: Path, fixtures: list[dict[str, object]], programs: list[dict[str, object]],
          repeated: list[dict[str, object]] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)  # a run of minutes is not lost to a missing folder
    path = out / "leak-kinds-valgrind.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    if old and (not fixtures or not programs):  # --only, --repeat: keep the other rows
        fixtures = fixtures or old["fixtures"]
        names = {p["program"] for p in programs}
        programs = [p for p in old["programs"] if p["program"] not in names] + programs
    names = {r["program"] for r in repeated or []}
    repeated = [r for r in old.get("repeated", []) if r["program"] not in names] + \
        (repeated or [])
    path.write_text(json.dumps({"machine": machine(), "fixtures": fixtures,
                                "programs": programs, "repeated": repeated}, indent=1) + "\n")
    lines = ["# Leak kinds: refcntd against valgrind memcheck", "",
             f"Machine: {machine()}. `benchmarks/kindsoracle.py` (its docstring says how "
             "objects are matched).", "", "## tests/fixtures/reach.c, object by object", "",
             "| object | refcntd | valgrind | equal |", "|---|---|---|---|"]
    lines += [f"| {r['object']} | {r['refcntd']} | {r['valgrind']} | "
              f"{'yes' if r['equal'] else '**no**'} |" for r in fixtures]
    lines += ["", "## GLib tests and gio tools, by allocation site (the two frames after "
              "g_object_new*)", "", "| program | site | refcntd | valgrind (blocks under "
              "g_type_create_instance) | equal |", "|---|---|---|---|---|"]
    lines += [f"| {r['program']} | {r['site']} | {_kinds(r['refcntd'])} | "
              f"{_kinds(r['valgrind'])} | {'yes' if r['equal'] else '**no**'} |"
              for r in programs]
    lines += repeated_table(repeated)
    md = out / "leak-kinds-valgrind.md"
    by_hand = md.read_text().partition("\n## Reading")[2] if md.exists() else ""
    md.write_text("\n".join(lines) + "\n" + (f"\n## Reading{by_hand}" if by_hand else ""))



def repeated_table(rows: list[dict[str, object]]) -> list[str]:
    """One line per site: each run's kinds on both sides (`-`: none alive there)."""
    if not rows:
        return []
    def runs(kinds: object) -> str:
        return " / ".join(_kinds(k) if k else "-" for k in kinds)  # type: ignore[attr-defined]
    return ["", "## Repeated runs (`--repeat N`: each run's kinds at the site, run by run)",
            "", "| program | site | refcntd, runs 1..N | valgrind, runs 1..N | verdict |",
            "|---|---|---|---|---|"] + \
        [f"| {r['program']} | {r['site']} | {runs(r['refcntd'])} | {runs(r['valgrind'])} | "
         f"{r['verdict'] if r['verdict'] != 'differ' else '**differ**'} |" for r in rows]

if __name__ == "__main__":
    sys.exit(main())
