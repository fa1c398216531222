#!/usr/bin/env python3
"""The classes refcntd reads at exit (reach/gtypes.py) against GLib's own answer, on the
same objects of the same process at the same moment.

`refcntd run --spec SPEC -- CMD` runs in this process with one change: after each
process held at _exit has been scanned, and before refcntd continues it, gdb attaches
to it and calls GLib in it for every object whose class refcntd tried to read:
`g_type_name_from_instance(obj)` (spec `class: {gtype: instance}`) or
`g_type_name(*(GType *)(obj + N))` (`{gtype: N}`).  Both answers are compared
object by object.  gdb is only the oracle: refcntd never calls into the process.

Usage (root): benchmarks/classesoracle.py [--spec gobject] [--json OUT] -- CMD [ARG...]
Prints one line per process and a total; --json writes them.  Exit status 1 when an
object's names differ (an object refcntd could not name is counted, not a failure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from refcntd.cli.main import main as refcntd_main  # noqa: E402
from refcntd.inputs.spec import ClassSource  # noqa: E402
from refcntd.reach.scan import ReachScan  # noqa: E402
from refcntd.session import exitscan  # noqa: E402

GDB_SCRIPT = """\
import gdb, json
gdb.execute("set unwindonsignal on")
gdb.execute("set confirm off")
gdb.execute("set scheduler-locking on")  # no other thread runs during the calls
gdb.execute("handle all nostop noprint nopass")  # the hold's SIGSTOP, pending signals
out = {}
for addr, call in json.load(open(%(items)r)):
    try:
        v = gdb.parse_and_eval(call)
        out[addr] = v.string() if int(v) else None
    except (gdb.error, gdb.MemoryError) as err:
        out[addr] = "!" + str(err)[:200]
json.dump(out, open(%(answer)r, "w"))
"""


@dataclass
class Compared:
    pid: int
    comm: str
    objects: int = 0
    same: int = 0
    different: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    refcntd_only: int = 0  # named by refcntd, not by GLib (would be a wrong name)
    refcntd_only_names: list[tuple[str, str]] = field(default_factory=list)
    gdb_only: int = 0  # named by GLib, not by refcntd (a miss: the type name is kept)
    neither: int = 0
    unchecked: int = 0  # gdb could not attach (the process gone meanwhile)
    read_seconds: float = 0.0  # refcntd's class read of this process (map walk + memory)
    gdb_seconds: float = 0.0


def gdb_names(pid: int, objects: dict[int, ClassSource]) -> dict[int, str | None]:
    """GLib's answer for each object, asked through gdb in the stopped process."""
    calls = [(hex(a), f"(const char *)g_type_name_from_instance((void *){a:#x})"
              if s.instance else f"(const char *)g_type_name(*(unsigned long *){a + s.offset:#x})")
             for a, s in objects.items()]
    with tempfile.TemporaryDirectory() as tmp:
        items, answer, script = (Path(tmp) / n for n in ("items.json", "answer.json",
                                                         "oracle.py"))
        items.write_text(json.dumps(calls))
        script.write_text(GDB_SCRIPT % {"items": str(items), "answer": str(answer)})
        env = dict(os.environ, DEBUGINFOD_URLS="")
        done = subprocess.run(["gdb", "-nx", "-p", str(_live_thread(pid)), "-batch", "-ex",
                        "set debuginfod enabled off", "-x", str(script)],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
        if not answer.exists():
            print(f"gdb on {pid} gave no answer: {done.stderr[-500:]}", file=sys.stderr)
            return {}
        return {int(a, 16): n for a, n in json.loads(answer.read_text()).items()}


def _live_thread(pid: int) -> int:
    """A thread gdb can attach through: the main one, or (a zombie after pthread_exit,
    the process held in another thread's _exit) one still alive."""
    for tid in [pid, *sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))]:
        try:
            state = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return tid
    return pid


def compare(pid: int, scan: ReachScan, objects: dict[int, ClassSource], seconds: float
            ) -> Compared:
    comm = Path(f"/proc/{pid}/comm").read_text().strip() if Path(f"/proc/{pid}").exists() \
        else "?"
    began = time.monotonic()
    truth = gdb_names(pid, objects)
    out = Compared(pid, comm, len(objects), read_seconds=seconds,
                   gdb_seconds=time.monotonic() - began)
    if objects and not truth:
        out.unchecked = len(objects)
        return out
    for address in objects:
        ours, raw = scan.classes.get(address), truth.get(address)
        theirs = raw if raw and not raw.startswith("!") else None  # "!": gdb's error
        if ours and theirs:
            if ours == theirs:
                out.same += 1
            else:
                out.different.append((hex(address), ours, theirs))
        elif ours:
            out.refcntd_only += 1
            out.refcntd_only_names.append((hex(address), f"{ours} (gdb: {raw})"))
        elif theirs:
            out.gdb_only += 1
        else:
            out.neither += 1
    return out


def install(results: list[Compared]) -> None:
    """After each held process's scan (still stopped), the oracle on the same objects."""
    held, name = exitscan.ExitScans.held, exitscan.ExitScans._name_classes
    seen: dict[int, tuple[dict[int, ClassSource], float]] = {}

    def name_classes(self: exitscan.ExitScans, tgid: int, scan: ReachScan) -> None:
        assert self.classed is not None
        classed = self.classed
        objects = classed(tgid)
        self.classed = lambda _tgid: objects
        began = time.monotonic()
        try:
            name(self, tgid, scan)
        finally:
            self.classed = classed
        seen[tgid] = (objects, time.monotonic() - began)

    def held_then_oracle(self: exitscan.ExitScans, tgid: int) -> None:
        held(self, tgid)
        scan = self.results.get(tgid)
        if scan is not None and tgid in seen:
            objects, seconds = seen.pop(tgid)
            results.append(compare(tgid, scan, objects, seconds))

    exitscan.ExitScans.held = held_then_oracle  # type: ignore[method-assign]
    exitscan.ExitScans._name_classes = name_classes  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="gobject")
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    results: list[Compared] = []
    install(results)
    with tempfile.TemporaryDirectory() as tmp:
        status = refcntd_main(["run", "--spec", args.spec, "--json", f"{tmp}/r.json",
                               "--", *command])
    for r in results:
        per = r.read_seconds / r.objects * 1e6 if r.objects else 0.0
        print(f"pid {r.pid} ({r.comm}): {r.objects} objects, {r.same} same, "
              f"{len(r.different)} different, {r.refcntd_only} refcntd only, "
              f"{r.gdb_only} GLib only, {r.neither} neither, {r.unchecked} unchecked; refcntd read "
              f"{r.read_seconds * 1e3:.2f} ms ({per:.1f} us/object)", file=sys.stderr)
        for a, n in r.refcntd_only_names[:5]:
            print(f"  {a}: refcntd {n!r}, GLib none", file=sys.stderr)
        for d in r.different[:5]:
            print(f"  {d[0]}: refcntd {d[1]!r}, GLib {d[2]!r}", file=sys.stderr)
    total = {k: sum(getattr(r, k) for r in results)
             for k in ("objects", "same", "refcntd_only", "gdb_only", "neither", "unchecked")}
    total["different"] = sum(len(r.different) for r in results)
    print(f"total: {total}; refcntd exit status {status}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"command": command, "spec": args.spec,
                                         "total": total, "status": status,
                                         "processes": [asdict(r) for r in results]},
                                        indent=1))
    return 1 if total["different"] or total["refcntd_only"] else 0


if __name__ == "__main__":
    sys.exit(main())
