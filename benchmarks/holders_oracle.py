"""Holders (refcntd/reach/holders.py) against gdb, object by object, on real programs:
writes results/holders.md/.json.

    sudo .venv/bin/python benchmarks/holders_oracle.py [--out DIR] [--only NAME ...]

Each program runs once, as `refcntd run [--history] -- gdb -x holders_gdb.py --args
PROGRAM`: refcntd's JSON gives every object alive at exit, its count, holders, unheld
references and pointers; gdb, the program's parent, sees the SIGSTOP of refcntd's exit
hold at `_exit` and dumps that same stopped process (benchmarks/holders_gdb.py: every
writable mapping's bytes, the threads' registers and frames, glibc's malloc state from
libc6-dbg's symbols, the structs' DWARF), then lets it go once refcntd's SIGCONT is
pending.  (Two separate runs with ASLR off do not do: perf 6.1's heap layout differs
from run to run after its first 150 chunks.)  Each object's count in memory at the
hold is read from the dump and set beside refcntd's final count: threads that run on
after the hold make them differ.

The oracle (this file, on gdb's bytes; no code of refcntd's): the malloc chunks from
glibc's own structures (the main heap from `mp_.sbrk_base` to `top`, other arenas'
heaps from their `heap_info`, mmapped chunks by their header bit; free: the next
chunk's PREV_INUSE clear, the top chunk, each thread's tcache lists and the arenas'
fastbins, safe-linking undone).  A slot is every aligned word of live memory holding
an address inside a tracked object's block: an in-use chunk, a module's writable
segment (.data/.bss), a thread's stack from its %rsp up, a register, another
writable mapping.  Words in free chunks, malloc's headers and stacks below %rsp are
garbage and listed apart.  A slot is not a holder when it is a link of the object's
own block into itself, or when it points at a member that DWARF types as an
`rb_node` whose parent word is itself (RB_CLEAR_NODE) or a `list_head` whose next and
prev are itself (INIT_LIST_HEAD/list_del_init) - without DWARF for the struct, a word
that holds its own address.

Per object: the oracle's holders and refcntd's, slot by slot (refcntd's JSON lists
the first 8 pointers, counted first; beyond that only the numbers are compared), the
count in memory against refcntd's, and who says "reference held by nothing".

perf 6.1 is built here (linux-source-6.1, benchmarks/mutants/perf/refcnt-stubs-6.1.patch,
the flags of mutants/codebases.py) under --work (default /work/mut/perf61) and records
its own perf.data; perf 6.12 uses the mutants' build and recording (read only).
valgrind memcheck runs on perf 6.1 beside (the memory kinds of the four objects).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REFCNTD = ROOT / ".venv" / "bin" / "refcntd"
sys.path.insert(0, str(HERE / "mutants"))

from codebases import PERF_FLAGS, PERF_MEMBERS, PERF_RECORD  # noqa: E402

UNHELD = "reference held by nothing"
ENV = ["PATH=/usr/bin:/bin", "HOME=/root", "LANG=C"]
PERF61_PATCH = HERE / "mutants" / "perf" / "refcnt-stubs-6.1.patch"
PERF612 = Path("/work/mut/perf")

PERF_TYPES = {t: {"struct": f"struct {t}", "count": ".refcnt.refs.counter", "describe": {}}
              for t in ("dso", "map", "maps", "thread", "nsinfo", "comm_str")}
PERF_TYPES["dso"]["describe"] = {"name": (".long_name", "str")}
PERF_TYPES["map"]["describe"] = {"dso": (".dso", "ptr"), "start": (".start", "u64")}
PERF_TYPES["thread"]["describe"] = {"tid": (".tid", "i32")}
PERF_TYPES["nsinfo"]["describe"] = {"pid": (".pid", "i32")}
# GObject: no DWARF for GLib here (no -dbgsym): GObject.ref_count is the guint at +8
# (GstMiniObject's refcount is there too; libvirt's objects, typed by class, are GObjects)
GOBJECT_TYPES = {"*": {"struct": "", "count": 8, "describe": {}}}


@dataclass
class Program:
    name: str
    cmd: list[str]
    spec: str
    types: dict
    expected: str
    history: bool = False
    env: list[str] = field(default_factory=list)
    valgrind: bool = False


def programs(work: Path, repeat: int = 3) -> dict[str, Program]:
    perf61, data61 = work / "build" / "perf", work / "perf61.data"
    return {p.name: p for p in [
        Program("perf 6.1 report", [str(perf61), "report", "-i", str(work / "perf61-B.data"),
                                    "--stdio"],
                "perf-stubs", PERF_TYPES, "issue 54: 4 objects alive at exit; the kernel dso "
                "(a get in machine__process_kernel_mmap_event via machine__findnew_dso, never "
                "put) held by nothing, its one pointer the stale rb_right of the libc dso's "
                "node.  Recorded with -B (no build-ids): the kernel dso is then made by "
                "machine__findnew_dso there, not found among the header's build-id dsos",
                history=True, valgrind=True),
        Program("perf 6.1 report, -B without callchains",
                [str(perf61), "report", "-i", str(work / "perf61-Bnog.data"), "--stdio"],
                "perf-stubs", PERF_TYPES, "the kernel dso's unput get alone: no callchain "
                "cursor keeps the kernel map, so nothing holds the dso (definitely lost); "
                "--history names machine__process_kernel_mmap_event",
                history=True),
        Program("perf 6.1 report, build-ids", [str(perf61), "report", "-i", str(data61),
                                               "--stdio"],
                "perf-stubs", PERF_TYPES, "the header's build-ids list the kernel dso: "
                "machine__process_kernel_mmap_event finds it without a get, no leak there"),
        Program("perf 6.12 report", [str(PERF612 / "build" / "perf"), "report", "-i",
                                     str(PERF612 / "work.data"), "--stdio"],
                "perf-stubs", PERF_TYPES, "80 objects alive at exit, all held (refcntd, "
                "2026-12-03)"),
        Program("gio list /usr/share", ["gio", "list", "/usr/share"], "gobject", GOBJECT_TYPES,
                "a GLocalFileEnumerator definitely lost and the GLocalFile it holds "
                "(valgrind, corpus_programs.REAL_LEAKS); GIO's kept singletons held",
                env=["G_SLICE=always-malloc"]),
        Program("gio tree /usr/share/glib-2.0", ["gio", "tree", "/usr/share/glib-2.0"],
                "gobject", GOBJECT_TYPES, "one GLocalFileEnumerator per directory definitely "
                "lost and the GLocalFiles they hold (valgrind)", env=["G_SLICE=always-malloc"]),
        Program("gio info /etc/passwd", ["gio", "info", "/etc/passwd"], "gobject",
                GOBJECT_TYPES, "clean: GIO's kept singletons (DESIGN 2026-11-25)",
                env=["G_SLICE=always-malloc"]),
        # threads run at exit: each run differs, three are kept
        *(Program(f"glib gdbus-close-pending #{i}",
                  ["/usr/libexec/installed-tests/glib/gdbus-close-pending"], "gobject",
                  GOBJECT_TYPES, "GIO objects alive at exit under its D-Bus worker thread "
                  "(corpus: 7, still reachable)", env=["G_SLICE=always-malloc"])
          for i in range(1, repeat + 1)),
        Program("gst-launch queue pipeline", ["gst-launch-1.0", "-q", "fakesrc",
                                              "num-buffers=200", "!", "queue", "!", "identity",
                                              "!", "queue", "!", "fakesink"],
                "gstreamer", GOBJECT_TYPES, "clean (DESIGN 2026-11-25); the registry's "
                "objects held", env=["G_SLICE=always-malloc"]),
        Program("virsh list", ["virsh", "-c", "test:///default", "list", "--all"], "libvirt",
                GOBJECT_TYPES, "clean (DESIGN 2026-11-25)", env=["G_SLICE=always-malloc"]),
    ]}


# ---- builds ---------------------------------------------------------------

def build_perf61(work: Path) -> dict:
    """linux-source-6.1's tools/perf with the stub patch, -O2 -g; a perf.data recorded
    with it.  Each step only when its output is missing."""
    steps: dict = {}
    src = work / "linux-source-6.1"
    tarball = Path("/usr/src/linux-source-6.1.tar.xz")
    if not tarball.exists():
        subprocess.run(["apt-get", "install", "-y", "linux-source-6.1"], check=True,
                       stdout=subprocess.DEVNULL)
    if not (src / "Makefile").exists():
        work.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        subprocess.run(["tar", "-xJf", str(tarball), "-C", str(work)]
                       + [f"linux-source-6.1/{m}" for m in PERF_MEMBERS], check=True)
        steps["extract_s"] = round(time.monotonic() - t, 1)
    marker = src / ".refcnt-stubs-applied"
    if not marker.exists():
        subprocess.run(["patch", "-p1", "-s", "-i", str(PERF61_PATCH)], cwd=src, check=True)
        marker.write_text(f"{PERF61_PATCH.relative_to(ROOT)}\n")
    build = work / "build"
    build.mkdir(parents=True, exist_ok=True)
    cmd = ["make", "-s", "-C", str(src / "tools" / "perf"), "-j2", f"O={build}", *PERF_FLAGS]
    if not (build / "perf").exists():  # built once (a rebuild with other flags is a full one)
        t = time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps["build_s"] = round(time.monotonic() - t, 1)
    steps["build_command"] = " ".join(cmd)
    for name, extra in (("perf61.data", ["-g"]), ("perf61-B.data", ["-B", "-g"]),
                        ("perf61-Bnog.data", ["-B"])):
        data = work / name
        if not data.exists():
            subprocess.run([str(build / "perf"), "record", "-q", *extra, "-F", "2000",
                            "-o", str(data), "--", "sh", "-c", PERF_RECORD], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        steps[name] = " ".join(["perf", "record", "-q", *extra, "-F", "2000", "--",
                                "sh", "-c", repr(PERF_RECORD)])
    return steps


# ---- the two runs -----------------------------------------------------------

def run(p: Program, out: Path) -> tuple[dict, dict]:
    """refcntd run -- gdb -x holders_gdb.py --args PROGRAM: refcntd's JSON and gdb's
    dump of the same process at the same hold."""
    out.mkdir(parents=True, exist_ok=True)
    gdir = out / "gdb"
    if gdir.exists():
        shutil.rmtree(gdir)
    gdir.mkdir(parents=True)
    structs = sorted({v["struct"] for v in p.types.values() if v["struct"]})
    env = {**os.environ, "HOLDERS_ORACLE_OUT": str(gdir),
           "HOLDERS_ORACLE_CONFIG": json.dumps({"structs": structs})}
    program = (["env", *p.env] if p.env else []) + p.cmd
    cmd = [str(REFCNTD), "run", "--json", str(out / "refcntd.json"), "--spec", p.spec,
           *(["--history"] if p.history else []), "--",
           "gdb", "-nx", "-batch", "-x", str(HERE / "holders_gdb.py"), "--args", *program]
    t = time.monotonic()
    r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, cwd="/tmp")
    (out / "refcntd.txt").write_text(r.stdout + "\n--- stderr\n" + r.stderr)
    report = json.loads((out / "refcntd.json").read_text())
    state_file = gdir / "state.json"
    if not state_file.exists():
        raise RuntimeError(f"gdb wrote no state for {p.name}: see {out / 'refcntd.txt'}")
    state = json.loads(state_file.read_text())
    state["dir"] = str(gdir)
    return ({"command": cmd, "exit": r.returncode, "seconds": round(time.monotonic() - t, 1),
             "report": report, "stdout": r.stdout}, state)


def instances(report: dict, pid: int) -> tuple[dict, list[dict]]:
    """The program's process (the one gdb dumped), its instances with their type."""
    for proc in report["processes"]:
        if proc["pid"] == pid:
            return proc, [dict(i, type=g["type"], alloc=" < ".join([
                f.get("function") or "?" for f in g["stack"]
                if not (f.get("function") or "").startswith(("g_object_new", "g_type_create"))
            ][:4]))
                for g in proc["groups"] for i in g["instances"]]
    raise RuntimeError(f"refcntd reports no process {pid}: "
                       f"{[(q['pid'], q['comm']) for q in report['processes']]}")


# ---- the oracle: gdb's bytes, glibc's chunks --------------------------------

class Memory:
    def __init__(self, state: dict) -> None:
        self.regions = []
        for r in state["regions"]:
            if r["file"]:
                raw = (Path(state["dir"]) / r["file"]).read_bytes()
                words = np.frombuffer(raw[:len(raw) // 8 * 8], np.uint64)
                self.regions.append((r["start"], r["end"], r, words))
        self.regions.sort(key=lambda x: x[0])
        self.starts = [r[0] for r in self.regions]

    def region(self, addr: int) -> tuple | None:
        i = int(np.searchsorted(self.starts, addr, "right")) - 1
        if i >= 0 and addr < self.regions[i][1]:
            return self.regions[i]
        return None

    def word(self, addr: int) -> int | None:
        r = self.region(addr)
        if r is None or addr % 8:
            return None
        return int(r[3][(addr - r[0]) // 8])


def chunks(mem: Memory, state: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
    """Every malloc chunk glibc's state leads to: user start, user end (the usable
    size), in use; and a summary."""
    m = state["malloc"]
    rows: list[tuple[int, int, bool]] = []
    summary = {"arenas": len(state["arenas"]), "walk_errors": []}

    def walk(start: int, stop: int, top: int) -> None:
        p = start
        while p < stop:
            size = mem.word(p + 8)
            if size is None:
                summary["walk_errors"].append(f"unreadable chunk 0x{p:x}")
                return
            sz = size & ~7
            if p == top:
                rows.append((p + 16, p + sz, False))
                return
            if sz < 16:  # a heap's fencepost
                return
            nxt = mem.word(p + sz + 8)
            inuse = nxt is not None and bool(nxt & 1)
            # the block ends at the next chunk's header: an in-use chunk may also use the
            # next one's prev_size word, but a pointer there is far more often one at that
            # chunk (as refcntd's blocks, and valgrind's, which end at the requested size)
            rows.append((p + 16, p + sz, inuse))
            p += sz

    heaps: list[tuple[int, int]] = []
    for a in state["arenas"]:
        if a["address"] == m["main_arena"]:
            walk(m["sbrk_base"], a["top"] + 1, a["top"])
            continue
        h = a["top"] & ~(m["heap_max"] - 1)
        first = True
        while h:
            size = mem.word(h + 16) or 0
            arena_here = mem.word(h) == a["address"] and a["address"] == h + m["heap_info_size"]
            start = h + m["heap_info_size"] + (m["malloc_state_size"] if arena_here else 0)
            start = (start + 15) & ~15
            walk(start, h + size, a["top"] if first else -1)
            heaps.append((h, h + size))
            first = False
            h = mem.word(h + 8) or 0
    # mmapped chunks: anonymous writable mappings outside every heap, chunk after chunk
    for lo, hi, r, _ in mem.regions:
        if r["name"] or any(a <= lo < b for a, b in heaps):
            continue
        p = lo
        while p + 16 <= hi:
            size = mem.word(p + 8) or 0
            sz = size & ~7
            if not size & 2 or sz < 4096 or p + sz > hi or (mem.word(p) or 0) != 0:
                break
            rows.append((p + 16, p + sz, True))
            p += sz
    rows.sort()
    starts = np.array([r[0] for r in rows], np.uint64)
    ends = np.array([r[1] for r in rows], np.uint64)
    inuse = np.array([r[2] for r in rows], bool)
    freed: set[int] = set()
    for th in state["threads"]:
        tc = th.get("tcache") or 0
        if not tc:
            continue
        for i in range(64):
            count = (mem.word(tc + (i * 2 // 8) * 8) or 0) >> (16 * (i % 4)) & 0xFFFF
            e = mem.word(tc + 128 + 8 * i) or 0
            for _ in range(count):
                if not e:
                    break
                freed.add(e)
                e = (mem.word(e) or 0) ^ (e >> 12)
    for a in state["arenas"]:
        for c in a["fastbins"]:
            for _ in range(100000):
                if not c:
                    break
                freed.add(c + 16)
                c = (mem.word(c + 16) or 0) ^ ((c + 16) >> 12)
    idx = np.searchsorted(starts, np.array(sorted(freed), np.uint64))
    ok = idx < len(starts)
    hit = idx[ok][starts[idx[ok]] == np.array(sorted(freed), np.uint64)[ok]]
    # a tcache or fastbin chunk keeps its neighbour's PREV_INUSE: in use to the walk
    inuse[hit] = False
    summary.update({"chunks": len(rows), "in_use": int(inuse.sum()),
                    "tcache_fastbin_free": len(freed), "matched_free": int(len(hit)),
                    "mmapped_heaps": len(heaps)})
    return starts, ends, inuse, summary


@dataclass
class OSlot:
    where: int  # 0: a register
    value: int
    source: str  # heap / module / stack / register / mapping / garbage
    holder: str
    counted: bool
    why: str = ""


def members_at(struct: dict | None, off: int) -> list[list]:
    if not struct or "members" not in struct:
        return []
    return [m for m in struct["members"] if m[0] == off]


def member_name(struct: dict | None, off: int) -> str | None:
    """The innermost member covering `off` whose start it is, else the covering one."""
    if not struct or "members" not in struct:
        return None
    cover = [m for m in struct["members"] if m[0] <= off < m[0] + max(m[1], 1)]
    if not cover:
        return None
    best = max(cover, key=lambda m: (m[2].count("."), m[0]))
    return best[2] + (f"+0x{off - best[0]:x}" if off != best[0] else "")


def oracle(state: dict, objs: list[dict], types: dict) -> dict:
    mem = Memory(state)
    starts, ends, inuse, summary = chunks(mem, state)
    tracked = {int(o["address"], 16): o for o in objs}
    structs = {t: state["structs"].get(spec["struct"]) for t, spec in types.items()}

    def chunk_of(addr: int) -> int:
        i = int(np.searchsorted(starts, addr, "right")) - 1
        return i if i >= 0 and addr < int(ends[i]) else -1

    def source_chunk(addr: int) -> int:
        """The chunk whose data holds the word at `addr`: an in-use chunk's data also
        takes the next chunk's prev_size word."""
        i = int(np.searchsorted(starts, addr, "right")) - 1
        if i >= 0 and addr < int(ends[i]) + (8 if inuse[i] else 0):
            return i
        return -1

    blocks = {}
    for a in tracked:
        i = chunk_of(a)
        blocks[a] = i
    # every word of writable memory, classified
    sps = [th["regs"]["rsp"] for th in state["threads"]]
    lo_v = np.array(sorted(a for a, i in blocks.items() if i >= 0), np.uint64)
    hi_v = np.array([int(ends[blocks[int(a)]]) for a in lo_v], np.uint64)
    found: dict[int, list[OSlot]] = {int(a): [] for a in lo_v}
    prev: tuple | None = None
    # malloc's own words (main_arena.top points at the top chunk's header, the last
    # usable word of the block before it): the arenas' malloc_state, the tcaches
    meta = [(a["address"], a["address"] + state["malloc"]["malloc_state_size"])
            for a in state["arenas"]]
    meta += [(th["tcache"], th["tcache"] + 0x280) for th in state["threads"] if th.get("tcache")]
    for lo, hi, r, words in mem.regions:
        kind, name = region_kind(lo, hi, r["name"], prev, starts, sps), r["name"]
        prev = (lo, hi, name, kind)
        if not len(lo_v):
            break
        j = np.searchsorted(lo_v, words, "right").astype(np.int64) - 1
        hit = np.flatnonzero((j >= 0) & (words < hi_v[np.maximum(j, 0)]))
        sp = min((s for s in sps if lo <= s < hi), default=lo)
        for k in hit.tolist():
            where, value = lo + 8 * k, int(words[k])
            obj = int(lo_v[j[k]])
            if any(m0 <= where < m1 for m0, m1 in meta):
                src, holder = "garbage", "malloc's own state (an arena's top or bins)"
            elif kind == "heap":
                c = source_chunk(where)
                if c < 0 or not inuse[c]:
                    src, holder = "garbage", ("a free chunk" if c >= 0 else "malloc's header")
                else:
                    src, holder = "heap", describe_block(int(starts[c]), int(ends[c]), where,
                                                         tracked, structs)
            elif kind == "stack":
                if sp - 128 <= where < sp:
                    src, holder = "garbage", ("the red zone (128 bytes below %rsp: live only "
                                              "while a leaf function uses it)")
                elif where < sp:
                    src, holder = "garbage", "below the stack pointer"
                else:
                    src, holder = stack_slot(state, where, sp, name)
            elif kind.startswith("module "):
                src, holder = "module", f"{kind[7:]}+0x{where - lo:x}"
            else:
                src, holder = "mapping", f"mapping 0x{lo:x}+0x{where - lo:x}"
            found[obj].append(OSlot(where, value, src, holder, src != "garbage"))
    for th in state["threads"]:
        for reg, v in th["regs"].items():
            if reg in ("rip",):
                continue
            i = int(np.searchsorted(lo_v, v, "right")) - 1
            if i >= 0 and v < int(hi_v[i]):
                found[int(lo_v[i])].append(OSlot(0, v, "register", f"{reg} of {th['tid']}",
                                                 True))
    # holders or not
    out = {}
    for a, o in tracked.items():
        b = blocks[a]
        res = {"type": o["type"], "count_memory": read_count(mem, types, structs, o["type"], a),
               "count_refcntd": o["count"], "block": None, "slots": [],
               "describe": describe(mem, types, structs, o["type"], a)}
        if b < 0 or not inuse[b]:
            res["block_error"] = "no in-use chunk holds it"
            out[a] = res
            continue
        bs, be = int(starts[b]), int(ends[b])
        res["block"] = [bs, be]
        st = structs.get(o["type"])
        for s in found.get(a, []):
            if not s.counted:
                s.why = "garbage: " + s.holder
            elif bs <= s.where < be + 8:  # its own data (prev_size word included)
                s.why = own_slot(st, s.where - a, s.value - a)
                s.counted = not s.why
            else:
                s.why = cleared(mem, st, s.value - a, s.value)
                s.counted = not s.why
            res["slots"].append(vars(s))
        res["holders"] = sum(1 for s in res["slots"] if s["counted"])
        out[a] = res
    return {"objects": out, "malloc": summary}


# libc's frames once main has returned (or exit was called): what they hold are their
# own locals and words left over from earlier calls, no reference of the program's
EXIT_PATH = ("_exit", "__GI__exit", "_Exit", "__run_exit_handlers", "exit", "__GI_exit",
             "__libc_start_call_main", "__libc_start_main_impl", "__libc_start_main", "_start")


def stack_slot(state: dict, where: int, sp: int, name: str) -> tuple[str, str]:
    """A live stack word: the frame holding it (gdb's unwind); words of libc's exit path
    frames are not the program's."""
    for th in state["threads"]:
        frames = th.get("frames") or []
        if not frames or not frames[0][2] <= where or th["regs"]["rsp"] != sp:
            continue
        for i, (fn, _pc, fsp) in enumerate(frames):
            upper = frames[i + 1][2] if i + 1 < len(frames) else 2**64
            if fsp <= where < upper:
                if fn in EXIT_PATH:
                    return "garbage", f"a word of libc's exit path frame {fn} (thread {th['tid']})"
                return "stack", f"stack frame {fn or '??'} (thread {th['tid']}) sp+0x{where - sp:x}"
    return "stack", f"stack {name or 'of a thread'} sp+0x{where - sp:x}"


def member_offset(struct: dict | None, path: str) -> int | None:
    for m in (struct or {}).get("members", []):
        if m[2] == path:
            return int(m[0])
    return None


def read_count(mem: Memory, types: dict, structs: dict, typ: str, a: int) -> int | None:
    spec = types.get(typ) or types.get("*")
    if not spec:
        return None
    off = spec["count"] if isinstance(spec["count"], int) else \
        member_offset(structs.get(typ), spec["count"])
    if off is None:
        return None
    w = mem.word((a + off) & ~7)
    return None if w is None else (w >> (8 * ((a + off) % 8))) & 0xFFFFFFFF


def describe(mem: Memory, types: dict, structs: dict, typ: str, a: int) -> dict:
    out: dict = {}
    for label, (path, how) in (types.get(typ) or types.get("*", {}))["describe"].items():
        off = member_offset(structs.get(typ), path)
        if off is None:
            continue
        w = mem.word((a + off) & ~7)
        if w is None:
            continue
        w >>= 8 * ((a + off) % 8)
        if how == "str":
            out[label] = read_str(mem, w)
        elif how == "i32":
            out[label] = w & 0xFFFFFFFF
        else:
            out[label] = hex(w)
    return out


def read_str(mem: Memory, addr: int, limit: int = 200) -> str:
    r = mem.region(addr)
    if r is None:
        return f"0x{addr:x}"
    raw = r[3].tobytes()[addr - r[0]:addr - r[0] + limit]
    return raw.split(b"\0")[0].decode(errors="replace")


def region_kind(lo: int, hi: int, name: str, prev: tuple | None, starts: np.ndarray,
                sps: list[int]) -> str:
    """heap (malloc chunks in it), stack (a thread's %rsp in it), `module NAME` (a file's
    writable segment, or the anonymous .bss right after it), mapping (the rest)."""
    if len(starts) and np.searchsorted(starts, lo) < np.searchsorted(starts, hi):
        return "heap"
    if name == "[stack]" or any(lo <= s < hi for s in sps):
        return "stack"
    if name and not name.startswith("["):
        return f"module {Path(name).name}"
    if not name and prev and prev[1] == lo and prev[3].startswith("module ") \
            and "bss" not in prev[3]:
        return f"{prev[3]} .bss"
    return "mapping"


def own_slot(st: dict | None, at: int, to: int) -> str:
    """A word of the object's own block pointing into it holds a reference only when it
    is a pointer member aimed at the object's start (a deliberate self reference); a
    node's links (rb_node's parent word, list_head's next/prev, which RB_CLEAR_NODE and
    INIT_LIST_HEAD aim at the node itself) and interior pointers do not.  Without DWARF
    for the struct: only a pointer to the start counts (as refcntd)."""
    if to != 0:
        return "a link of its own block into itself"
    ms = [m for m in (st or {}).get("members", []) if m[0] <= at < m[0] + max(m[1], 1)]
    if not ms:
        return ""
    inner = max(ms, key=lambda m: m[2].count("."))
    if "rb_node" in " ".join(m[3] for m in ms) or "list_head" in " ".join(m[3] for m in ms):
        return f"its own node's link {inner[2]} (a cleared/empty node points to itself)"
    if inner[3] != "ptr":
        return f"its own {inner[2]} ({inner[3]}), not a pointer member"
    return ""


def cleared(mem: Memory, st: dict | None, off: int, value: int) -> str:
    """Why a pointer at member `off` is stale: that member is an unlinked node.  A
    pointer to the start is a reference to the object, whatever its first member is
    (struct map's rb_node is at +0 and cleared while the map is out of every tree)."""
    if off == 0:
        return ""
    ms = members_at(st, off)
    kinds = " ".join(m[3] for m in ms)
    if "rb_node" in kinds:
        if mem.word(value) is not None and (mem.word(value) or 0) & ~3 == value:
            return "points at an rb_node cleared by RB_CLEAR_NODE (DWARF)"
        return ""
    if "list_head" in kinds:
        if mem.word(value) == value and mem.word(value + 8) == value:
            return "points at an empty/unlinked list_head (DWARF)"
        return ""
    if not ms and mem.word(value) == value:
        return "points at a word holding its own address (no DWARF member)"
    return ""


def describe_block(bs: int, be: int, where: int, tracked: dict, structs: dict) -> str:
    inside = [a for a in tracked if bs <= a < be]
    if inside:
        a = max((x for x in inside if x <= where), default=min(inside))
        t = tracked[a]["type"]
        m = member_name(structs.get(t), where - a) if where >= a else None
        off = f"+0x{where - a:x}" if where >= a else f"-0x{a - where:x}"
        return f"{t} 0x{a:x} " + (f".{m.lstrip('.')}" if m else off)
    return f"a {be - bs}-byte block 0x{bs:x}+0x{where - bs:x}"


# ---- the comparison ---------------------------------------------------------

def compare(objs: list[dict], orc: dict) -> dict:
    rows, agree, disagree, unheld_r, layout_bad = [], 0, 0, 0, 0
    for o in objs:
        a = int(o["address"], 16)
        x = orc["objects"][a]
        ptrs = o.get("pointers", [])
        r_counted = {int(p["slot"], 16) for p in ptrs if p["counted"]}
        r_not = {int(p["slot"], 16): p.get("why", "") for p in ptrs if not p["counted"]}
        o_counted = {s["where"] for s in x["slots"] if s["counted"]}
        o_slot = {s["where"]: s for s in x["slots"]}
        complete = len(ptrs) < 8  # refcntd's JSON keeps 8, counted first
        notes = []
        same_layout = x.get("count_memory") == o["count"] and x.get("block") is not None
        if not same_layout:
            layout_bad += 1
            notes.append(f"layout/count differ: memory {x.get('count_memory')} refcntd "
                         f"{o['count']} block {x.get('block')}")
        ok_slots = bad_slots = 0
        for w in sorted(r_counted | set(r_not)):
            if w == 0:  # a register: compared by number below
                continue
            s = o_slot.get(w)
            r_says = w in r_counted
            o_says = bool(s and s["counted"])
            if r_says == o_says:
                ok_slots += 1
            else:
                bad_slots += 1
                notes.append(f"slot 0x{w:x}: refcntd {'counts' if r_says else 'does not count'}"
                             f" ({r_not.get(w, '')}), oracle "
                             + (f"{'counts' if o_says else 'does not'} ({s['holder']}; "
                                f"{s['why']})" if s else "finds no such pointer"))
        if complete:
            for w in sorted(o_counted - r_counted - {0}):
                bad_slots += 1
                notes.append(f"slot 0x{w:x} ({o_slot[w]['holder']}): a holder to the oracle, "
                             "not in refcntd's pointers")
        r_holders, o_holders = o.get("holders", -1), x.get("holders", -1)
        if r_holders == o_holders and not bad_slots:
            agree += 1
        else:
            disagree += 1
            if r_holders != o_holders:
                notes.append(f"holders: refcntd {r_holders}, oracle {o_holders}")
        o_unheld_n = (x.get("count_memory") or 0) - max(o_holders, 0)
        unheld_r += o.get("kind") == UNHELD
        rows.append({"address": o["address"], "type": o["type"], "kind": o.get("kind", ""),
                     "count": o["count"], "count_memory": x.get("count_memory"),
                     "refcntd_holders": r_holders, "oracle_holders": o_holders,
                     "refcntd_unheld": o.get("unheld"), "oracle_unheld": o_unheld_n,
                     "slots_agree": ok_slots, "slots_disagree": bad_slots,
                     "refcntd_pointers": ptrs, "oracle_slots": kept_slots(x["slots"]),
                     "oracle_garbage_slots": sum(1 for s in x["slots"]
                                                 if s["source"] == "garbage"),
                     "describe": x.get("describe", {}) or {"allocated at": o.get("alloc")},
                     "notes": notes})
    return {"objects": len(objs), "agree": agree, "disagree": disagree,
            "layout_mismatch": layout_bad, "unheld_refcntd": unheld_r,
            "unheld_oracle": sum(1 for r in rows if r["oracle_unheld"] > 0
                                 and r["kind"] in (UNHELD, "still reachable")),
            "rows": rows}


def kept_slots(slots: list[dict], garbage: int = 8) -> list[dict]:
    """Every live slot, and the first few garbage ones (perf keeps thousands of stale
    pointers in free chunks): the JSON stays small; their number is kept beside."""
    live = [s for s in slots if s["source"] != "garbage"]
    return live + [s for s in slots if s["source"] == "garbage"][:garbage]


# ---- valgrind (perf 6.1) ---------------------------------------------------

def run_valgrind(p: Program, out: Path) -> dict:
    log = out / "valgrind.log"
    cmd = ["valgrind", "--leak-check=full", "--show-leak-kinds=all", "--num-callers=12",
           f"--log-file={log}", *p.cmd]
    t = time.monotonic()
    subprocess.run(["env", "-i", *ENV, *p.env, *cmd], stdin=subprocess.DEVNULL,
                   capture_output=True, cwd="/tmp")
    text = log.read_text()
    records = []
    for block in re.split(r"\n==\d+== \n", text):
        m = re.search(r"([\d,]+)(?: \([^)]*\))? bytes in ([\d,]+) blocks are ([a-z ]+?) in loss",
                      block)
        if not m:
            continue
        funcs = re.findall(r"(?:at|by) 0x[0-9A-F]+: (\S+)", block)
        interest = [f for f in funcs if re.match(r"(dso|map|maps|thread|nsinfo|comm_str)__"
                                                 r"(new|new_id|clone|findnew|init)", f)]
        if interest:
            records.append({"bytes": int(m[1].replace(",", "")),
                            "blocks": int(m[2].replace(",", "")), "kind": m[3],
                            "frames": funcs[:8]})
    return {"command": cmd, "seconds": round(time.monotonic() - t, 1), "records": records}


# ---- main -------------------------------------------------------------------

def machine() -> dict:
    return {"uname": os.uname().release, "cpus": os.cpu_count(),
            "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/work/mut/perf61"))
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/holders-oracle"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the threaded GLib test")
    ap.add_argument("--render", action="store_true", help="only rewrite holders.md from .json")
    args = ap.parse_args()
    if args.render:
        result = json.loads((args.out / "holders.json").read_text())
        (args.out / "holders.md").write_text(markdown(result))
        return
    progs = programs(args.work, args.repeat)
    chosen = [progs[n] for n in (args.only or progs)]
    result: dict = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                    "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short",
                                              "HEAD"], capture_output=True,
                                             text=True).stdout.strip(),
                    "machine": machine(), "programs": {}}
    if any(p.name.startswith("perf 6.1 ") for p in chosen):
        result["perf61_build"] = build_perf61(args.work)
    for p in chosen:
        out = args.runs / re.sub(r"\W+", "-", p.name)
        print(f"== {p.name}", file=sys.stderr)
        r, g = run(p, out)
        proc, objs = instances(r["report"], g["pid"])
        orc = oracle(g, objs, p.types)
        cmp = compare(objs, orc)
        entry = {"command": p.cmd, "spec": p.spec, "history": p.history,
                 "expected": p.expected, "refcntd_exit": r["exit"],
                 "seconds": r["seconds"], "gdb_stopped_at": g["stopped_at"],
                 "malloc": orc["malloc"],
                 "text_holders": [ln for ln in r["stdout"].splitlines()
                                  if "holder" in ln.lower() or UNHELD in ln][:40],
                 "culprits": [c for grp in proc.get("groups", []) if grp.get("kind") == UNHELD
                              for c in grp.get("culprits", [])][:4],
                 **cmp}
        if p.valgrind:
            entry["valgrind"] = run_valgrind(p, out)
        result["programs"][p.name] = entry
        print(f"   {cmp['objects']} objects, {cmp['agree']} agree, {cmp['disagree']} disagree,"
              f" unheld refcntd {cmp['unheld_refcntd']} oracle {cmp['unheld_oracle']}",
              file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    previous = args.out / "holders.json"
    if args.only and previous.exists():  # the other programs' results stay, with their date
        old = json.loads(previous.read_text())
        for name, entry in old["programs"].items():
            if name not in result["programs"]:
                entry.setdefault("date", old["date"])
                entry.setdefault("commit", old["commit"])
                result["programs"][name] = entry
        result["programs"] = {n: result["programs"][n] for n in progs if n in result["programs"]}
    (args.out / "holders.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "holders.md").write_text(markdown(result))


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["# Holders against gdb (benchmarks/holders_oracle.py)", "",
             f"{result['date']}, commit {result['commit']}, kernel {m['uname']}, "
             f"{m['cpus']} CPUs, load {m['load']:.1f} at the start.", "",
             "objects: alive at exit (refcntd's JSON); agree: the same holders, slot by slot "
             "(beyond refcntd's 8 listed pointers, the number); count differs: refcntd's final "
             "count is not the count in memory at the hold (threads ran on after it); count > "
             "holders: objects with a reference no slot holds, refcntd's `unheld` and the "
             "oracle's (count in memory minus its holders), any kind; kind: refcntd's "
             "`reference held by nothing`.", "",
             "| program | objects | holders agree | disagree | count differs | count > holders "
             "(refcntd / oracle) | kind 'held by nothing' | expected |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, e in result["programs"].items():
        r_any = sum(1 for r in e["rows"] if (r["refcntd_unheld"] or 0) > 0)
        o_any = sum(1 for r in e["rows"] if r["oracle_unheld"] > 0 and r["oracle_holders"] >= 0)
        lines.append(f"| {name} | {e['objects']} | {e['agree']} | {e['disagree']} | "
                     f"{e['layout_mismatch']} | {r_any} / {o_any} | {e['unheld_refcntd']} "
                     f"| {e['expected']} |")
    for name, e in result["programs"].items():
        lines += ["", f"## {name}", "", f"`{' '.join(e['command'])}` (spec {e['spec']}"
                  f"{', --history' if e['history'] else ''}); refcntd exit {e['refcntd_exit']}"
                  f"; malloc: {e['malloc']}", ""]
        for r in e["rows"]:
            if r["notes"] or r["kind"] == UNHELD or r["refcntd_holders"] == 0 or \
                    len(e["rows"]) <= 12:
                desc = ", ".join(f"{k} {v}" for k, v in r["describe"].items())
                lines.append(f"- {r['type']} {r['address']} ({desc}): {r['kind']}, count "
                             f"{r['count']} (memory {r['count_memory']}), holders refcntd "
                             f"{r['refcntd_holders']} / oracle {r['oracle_holders']}")
                for s in r["oracle_slots"][:10]:
                    lines.append(f"  - oracle: 0x{s['where']:x} = 0x{s['value']:x} "
                                 f"{s['source']} {s['holder']}: "
                                 f"{'holder' if s['counted'] else 'not a holder'}"
                                 f"{' (' + s['why'] + ')' if s['why'] else ''}")
                for pt in r["refcntd_pointers"]:
                    lines.append(f"  - refcntd: {pt['slot']} {pt['holder']}: "
                                 f"{'holder' if pt['counted'] else 'not a holder'}"
                                 f"{' (' + pt['why'] + ')' if pt.get('why') else ''}")
                for n in r["notes"]:
                    lines.append(f"  - **{n}**")
        if e.get("find"):
            lines += ["", "gdb `find /g` over [heap]: " + "; ".join(
                f"{v}: {', '.join(hex(h) for h in hits) or 'none'}"
                for v, hits in e["find"].items())]
        if e.get("culprits"):
            lines += ["", "culprits (--history): " + json.dumps(e["culprits"])[:600]]
        if e.get("valgrind"):
            lines += ["", "valgrind memcheck (records with a dso/map/maps/thread allocation):"]
            for rec in e["valgrind"]["records"]:
                lines.append(f"- {rec['bytes']} bytes in {rec['blocks']} blocks {rec['kind']}: "
                             f"{' < '.join(rec['frames'][:10])}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
