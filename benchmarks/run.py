"""What refcntd costs the traced program, against the uprobe floor and the
alternatives.  One command (see benchmarks/README.md):

    sudo .venv/bin/python benchmarks/run.py [--smoke] [--out DIR]

Prints a table and writes results.md and results.json into DIR.  Ratios are
taken against the uprobe floor measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from refcntd.binary.plan import build_plan  # noqa: E402
from refcntd.inputs.spec import load_spec  # noqa: E402
from refcntd.kernel import perf_uprobe  # noqa: E402
from refcntd.kernel.kheaders import find_kernel_source  # noqa: E402

REFCNTD = [sys.executable, "-m", "refcntd"]
PER_SITE_MAX = 100  # call sites attached one perf event each in the attach-time table
HERE = Path(__file__).resolve().parent
EXAMPLES = ROOT / "examples"


@dataclass
class Sizes:
    calls: int  # get+put pairs per run
    churn: int
    runs: int
    scale: tuple[int, ...]
    perflike_samples: int
    sites: tuple[int, ...] = (10, 100, 1_000, 10_000)  # call sites for the attach-time table


FULL = Sizes(calls=100_000, churn=20_000, runs=5, scale=(10_000, 100_000, 1_000_000),
             perflike_samples=20_000)
SMOKE = Sizes(calls=2_000, churn=500, runs=1, scale=(1_000,), perflike_samples=200,
              sites=(10, 30))  # 100 per-site detaches alone took 8 s


@dataclass
class Row:
    name: str
    values: list[float]
    unit: str = "ns/call"
    note: str = ""
    ratio_to: str = ""  # row name this is a ratio against
    extra: dict = field(default_factory=dict)
    bpf: list[float] = field(default_factory=list)  # ns per probe run inside BPF (ProbeClock)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def spread(self) -> str:
        return f"{min(self.values):.0f}-{max(self.values):.0f}" if self.values else "-"


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


# ---- builds ------------------------------------------------------------------------
def build(out: Path) -> dict[str, Path]:
    b = out / "build"
    b.mkdir(parents=True, exist_ok=True)
    inc = [f"-I{EXAMPLES}", f"-I{b}"]
    common = ["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", *inc]
    sh(["dtrace", "-h", "-s", str(HERE / "benchprobes.d"), "-o", str(b / "benchprobes.h")])
    sh(["dtrace", "-G", "-s", str(HERE / "benchprobes.d"), "-o", str(b / "benchprobes.o")])
    for opt in ("O0", "O2"):
        sh(["gcc", f"-{opt}", "-c", "-o", str(b / f"refcnt-{opt}.o"), str(EXAMPLES / "refcnt.c")])
        sh(["gcc", *common, "-o", str(b / f"bench-{opt}"), str(HERE / "bench.c"),
            str(b / f"refcnt-{opt}.o")])
    sh(["gcc", "-O2", "-fPIC", "-shared", "-o", str(b / "librefcnt.so"),
        str(EXAMPLES / "refcnt.c")])
    sh(["gcc", *common, "-o", str(b / "bench-lib"), str(HERE / "bench.c"), f"-L{b}",
        "-lrefcnt", f"-Wl,-rpath,{b}"])
    sh(["gcc", "-O2", "-fPIC", "-shared", *inc, "-o", str(b / "interposer.so"),
        str(HERE / "interposer.c")])
    sh(["gcc", *common, "-DWITH_USDT", "-o", str(b / "bench-usdt"), str(HERE / "bench.c"),
        str(b / "refcnt-O0.o"), str(b / "benchprobes.o")])
    sh(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-o", str(b / "perflike"),
        str(EXAMPLES / "perflike.c"), str(EXAMPLES / "refcnt.c"), *inc])
    lib_spec = b / "bench-lib.yaml"  # the stubs exported by librefcnt.so, called via PLT
    lib_spec.write_text((ROOT / "configs/specs/perf-stubs.yaml").read_text().replace(
        "\nroles:", f"\nlibrary: {b / 'librefcnt.so'}\nroles:", 1))
    usdt_spec = b / "bench-usdt.yaml"
    usdt_spec.write_text("version: 1\nname: bench-usdt\nroles:\n"
                         "  init: {functions: [__refcnt__init], object: arg3, type: arg4,"
                         " initial_count: arg2}\n"
                         "  get: {usdt: \"bench:get\", object: arg1}\n"
                         "  put: {usdt: \"bench:put\", object: arg1}\n")
    return {p.name: p for p in b.iterdir()}


# ---- measurements ------------------------------------------------------------------
def ns_of(output: str) -> float:
    return float(re.search(r"^ns ([0-9.]+)$", output, re.M).group(1))


def untraced(exe: Path, mode: str, n: int, env: dict | None = None) -> float:
    return ns_of(sh([str(exe), mode, str(n)], env=env).stdout)


def traced(exe: Path, mode: str, n: int, extra: list[str] = ()) -> tuple[float, str, float]:
    """(ns per call in the program, its output, ns per probe run inside BPF)."""
    proc = subprocess.Popen([*REFCNTD, "run", *extra, "--", str(exe), mode, str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    with ProbeClock(proc.pid) as clock:
        out, err = proc.communicate()
    if proc.returncode not in (0, 23):
        raise RuntimeError(f"refcntd run failed ({proc.returncode}): {err[-2000:]}")
    return ns_of(out), out, clock.ns_per_run()


def attached(exe: Path, mode: str, n: int) -> tuple[float, float]:
    """The program run while `refcntd attach --binary` traces it system-wide: attach's
    kernel side also counts live objects per allocation site and age (as serve's).
    (ns per call in the program, ns per probe run inside BPF)."""
    proc = subprocess.Popen([*REFCNTD, "attach", "--binary", str(exe)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "attached to" in line:
                break
        else:
            raise RuntimeError("refcntd attach did not start")
        with ProbeClock(proc.pid) as clock:
            ns = untraced(exe, mode, n)
            clock.sample()
        return ns, clock.ns_per_run()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


class ProbeClock:
    """The time a refcntd process's probe programs spend inside BPF per run (on_probe and
    what it tail-calls; kernel.bpf_stats_enabled), without the uprobe trap around them.

    Sampled from the process's /proc/PID/fdinfo while it runs (its programs are gone
    once it detaches): the counts are cumulative, so the last sample holds them all."""

    STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
    enabled = False  # --bpf-time: the kernel's accounting costs each probe run a little

    def __init__(self, pid: int) -> None:
        self.pid, self.runs, self.ns = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ProbeClock:
        if not self.enabled:
            return self
        self._saved = self.STATS.read_text().strip()
        self.STATS.write_text("1")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self._stop.set()
        self._thread.join()
        self.STATS.write_text(self._saved)

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.sample()

    def sample(self) -> None:
        if not self.enabled:
            return
        runs = ns = 0
        try:
            infos = list(Path(f"/proc/{self.pid}/fdinfo").iterdir())
        except OSError:
            return
        for info in infos:
            try:
                fields = dict(line.split(":\t", 1) for line in info.read_text().splitlines()
                              if ":\t" in line)
            except OSError:
                continue
            if fields.get("prog_type", "").strip() == "2":  # kprobe: the probe programs
                runs += int(fields.get("run_cnt", "0"))
                ns += int(fields.get("run_time_ns", "0"))
        if runs > self.runs:
            self.runs, self.ns = runs, ns

    def ns_per_run(self) -> float:
        return self.ns / self.runs if self.runs else float("nan")


class Floor:
    """An empty BPF program on the instructions refcntd probes for get and put."""

    def __init__(self, exe: Path, spec: str = "perf-stubs", mode: str = "auto") -> None:
        os.environ.setdefault("BCC_KERNEL_SOURCE", str(find_kernel_source()))
        from bcc import BPF
        plan = build_plan(load_spec(spec), str(exe), {"*": mode})
        self.sites = [s for s in plan.sites if s.role in ("get", "put")]
        self.bpf = BPF(src_file=str(HERE / "empty.bpf.c"))
        prog = self.bpf.load_func("on_probe", BPF.KPROBE)
        self.fds = []
        for site in self.sites:
            fd = perf_uprobe.open_uprobe(site.module, site.file_offset,
                                         ref_ctr_offset=site.ref_ctr_offset)
            self.fds += [fd, perf_uprobe.link_bpf(prog.fd, fd, 0)]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.bpf.cleanup()

    def describe(self) -> str:
        entry = [f"{s.role} +{s.probe_offset} ({s.cost})" for s in self.sites if not s.site_kind]
        calls = {}
        for s in self.sites:
            if s.site_kind:
                calls[s.role] = calls.get(s.role, 0) + 1
        return ", ".join(entry + [f"{role}: {n} call sites (emulated)"
                                  for role, n in calls.items()])


def repeat(n: int, fn: callable) -> list[float]:
    return [fn() for _ in range(n)]


def clocked(n: int, fn: callable) -> dict:
    """Row fields of n runs of fn() -> (ns per call, ns per probe run inside BPF)."""
    runs = [fn() for _ in range(n)]
    return {"values": [ns for ns, *_ in runs], "bpf": [r[-1] for r in runs if r[-1] == r[-1]]}


def memleak(exe: Path, n: int) -> float:
    """bcc's memleak tracing the process's malloc/free (attached by pid before the loop)."""
    proc = subprocess.Popen([str(exe), "malloc", str(n), "wait"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    tool = subprocess.Popen(["memleak-bpfcc", "-p", str(proc.pid), "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # memleak prints this once its probes are attached
        line = tool.stdout.readline()
        if "Attaching to pid" in line or not line:
            break
    drain = threading.Thread(target=tool.stdout.read, daemon=True)  # never a full pipe
    drain.start()
    time.sleep(1.0)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out = proc.stdout.read()
    proc.wait()
    tool.send_signal(signal.SIGINT)
    try:
        tool.wait(timeout=60)
    except subprocess.TimeoutExpired:  # seen once in a full test run; the time is the program's
        print("benchmark: memleak-bpfcc did not exit on SIGINT within 60 s: killed",
              file=sys.stderr)
        tool.kill()
        tool.wait()
    return ns_of(out)


def scale(exe: Path, n: int, out: Path) -> dict:
    """Time from the process's exit to its report (the SUMMARY line refcntd prints when
    the exit is processed), with n live objects; and to the run's JSON file."""
    report = out / f"scale-{n}.json"
    t0 = time.time()
    proc = subprocess.Popen([*REFCNTD, "run", "--max-objects", str(max(n * 2, 1 << 20)),
                             "--json", str(report), "--", str(exe), "live", str(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    summary_at = None
    for line in proc.stderr:
        if line.startswith("SUMMARY: refcntd:") and summary_at is None:
            summary_at = time.time()
    out_text = proc.stdout.read()
    proc.wait()
    done = time.time()
    exit_at = float(re.search(r"exit_at ([0-9.]+)", out_text).group(1))
    leaked = json.loads(report.read_text())["leaked_objects"]
    return {"objects": n, "leaked_reported": leaked, "exit_to_report_s": summary_at - exit_at,
            "exit_to_run_json_s": report.stat().st_mtime - exit_at,
            "refcntd_exit_s": done - exit_at, "total_s": done - t0,
            "run_json_mib": round(report.stat().st_size / 2**20, 1),
            "maxrss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def map_bytes_per_object(n: int) -> dict:
    """bytes_memlock of the object map, empty and with n entries (kernel accounting)."""
    os.environ.setdefault("BCC_KERNEL_SOURCE", str(find_kernel_source()))
    from refcntd.kernel import abi
    from refcntd.kernel.loader import Kernel
    from refcntd.kernel.program import KernelOptions
    kernel = Kernel(KernelOptions(filtered=True, has_delete=True), [])
    try:
        objs = kernel.bpf["objs"]
        before = _memlock(objs.map_fd)
        for i in range(n):
            objs[abi.ObjKey(tgid=1, addr=0x1000 + 64 * i)] = abi.ObjVal(count=1)
        after = _memlock(objs.map_fd)
    finally:
        kernel.detach()
    return {"entries": n, "bytes_before": before, "bytes_after": after,
            "bytes_per_object": (after - before) / n}


def _memlock(fd: int) -> int:
    text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    return int(re.search(r"^memlock:\s+(\d+)", text, re.M).group(1))


def attach_time(lib: Path) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen([*REFCNTD, "attach", "--binary", str(lib)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while "attached" not in proc.stderr.readline():  # after any progress lines
        pass
    elapsed = time.monotonic() - t0
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return elapsed


def attach_sites(n: int, out: Path) -> dict:
    """Attach time against the number of call sites: a program calling the -O2 get stub
    from n places; the plan (code sweep), one multi-uprobe link, and one perf event per
    site for comparison; and `refcntd attach` from start to 'attached'."""
    from refcntd.kernel.loader import Kernel
    from refcntd.kernel.program import KernelOptions
    src = out / f"sites-{n}.c"
    src.write_text('#include "refcnt.h"\nstruct obj { atomic_t refcnt; };\n'
                   "void many(struct obj *o)\n{\n" + "\trefcnt__get(o, refcnt);\n" * n +
                   "}\nint main(void) { return 0; }\n")
    exe = out / "build" / f"sites-{n}"
    sh(["gcc", "-O2", f"-I{EXAMPLES}", "-o", str(exe), str(src), str(out / "build/refcnt-O2.o")])
    t0 = time.monotonic()
    plan = build_plan(load_spec("perf-stubs"), str(exe), {"*": "callsites"})
    plan_s = time.monotonic() - t0
    sites = len(plan.sites)
    timings: dict = {(False, "detach"): None, False: None}
    # Closing a per-site perf event unregisters its uprobe alone (~0.15 s each here):
    # 10 000 of them would take half an hour, so per-site is measured up to 100 sites.
    for multi in (True, False) if n <= PER_SITE_MAX else (True,):
        kernel = Kernel(KernelOptions(filtered=True, has_delete=True), plan.sites,
                        multi=multi)
        try:
            t0 = time.monotonic()
            kernel.probes.attach_all()
            timings[multi] = time.monotonic() - t0
            assert not kernel.probes.failed_probes, kernel.probes.failed_probes[:3]
        finally:
            t0 = time.monotonic()
            kernel.detach()
            timings[(multi, "detach")] = time.monotonic() - t0
    return {"call_sites": n, "probes": sites, "plan_s": plan_s, "multi_link_s": timings[True],
            "per_site_perf_events_s": timings[False],
            "detach_multi_s": timings[(True, "detach")],
            "detach_per_site_s": timings[(False, "detach")],
            "refcntd_attach_s": attach_time(exe)}


def wall(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=False, capture_output=True, cwd=ROOT)
    return time.monotonic() - t0


def xol_mapping(exe: Path) -> int:
    """[uprobes] XOL mappings in a target during an entry-probe-only refcntd run."""
    proc = subprocess.Popen([*REFCNTD, "attach", "--binary", str(exe)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while "attached" not in proc.stderr.readline():  # after any progress lines
        pass
    target = subprocess.Popen([str(exe), "getput", "1000", "wait"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    target.stdout.readline()
    target.stdin.write("go\n")
    target.stdin.flush()
    target.stdout.readline()  # ns line: the loop ran; the process is exiting
    count = 0
    try:
        count = Path(f"/proc/{target.pid}/maps").read_text().count("[uprobes]")
    except OSError:
        pass
    target.wait()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    return count


# ---- the whole benchmark -----------------------------------------------------------
def measure(sizes: Sizes, out: Path, per_call_only: bool = False) -> dict:
    """Every row; `per_call_only`: the get/put rows against their floors (minutes, not
    the better part of an hour)."""
    b = build(out)
    rows: list[Row] = []
    n, r = sizes.calls, sizes.runs
    o0, o2, lib = b["bench-O0"], b["bench-O2"], b["bench-lib"]

    rows.append(Row("no tracer (-O0 stubs)", repeat(r, lambda: untraced(o0, "getput", n))))
    floor = Floor(o0)
    rows.append(Row("uprobe floor: empty program, same instructions", repeat(
        r, lambda: untraced(o0, "getput", n)), note=floor.describe()))
    floor.close()
    rows.append(Row("refcntd counting", **clocked(r, lambda: traced(o0, "getput", n)),
                    ratio_to="uprobe floor: empty program, same instructions"))
    rows.append(Row("refcntd attach counting (per-site and age counts, as serve)",
                    **clocked(r, lambda: attached(o0, "getput", n)),
                    ratio_to="uprobe floor: empty program, same instructions"))
    rows.append(Row("init+release pair, no tracer", repeat(
        r, lambda: untraced(o0, "churn", sizes.churn)), unit="ns/pair"))
    rows.append(Row("init+release pair, refcntd run (allocation stack per init)",
                    **clocked(r, lambda: traced(o0, "churn", sizes.churn)), unit="ns/pair"))
    rows.append(Row("init+release pair, refcntd attach (per-site and age counts)",
                    **clocked(r, lambda: attached(o0, "churn", sizes.churn)), unit="ns/pair"))
    rows.append(Row("refcntd counting + --history",
                    **clocked(r, lambda: traced(o0, "getput", n, ["--history"])),
                    ratio_to="uprobe floor: empty program, same instructions"))
    rows.append(Row("no tracer (-O2 lock-prefixed stubs)",
                    repeat(r, lambda: untraced(o2, "getput", n))))
    floor2 = Floor(o2)
    rows.append(Row("uprobe floor on the -O2 build's probe points", repeat(
        r, lambda: untraced(o2, "getput", n)), note=floor2.describe()))
    floor2.close()
    rows.append(Row("refcntd counting, -O2 lock-prefixed stubs",
                    **clocked(r, lambda: traced(o2, "getput", n)),
                    ratio_to="uprobe floor: empty program, same instructions",
                    note="call-site probes (--probe-mode auto)"))
    floor3 = Floor(o2, mode="entry")
    rows.append(Row("uprobe floor on the -O2 build's entry probes (single-stepped)", repeat(
        r, lambda: untraced(o2, "getput", n)), note=floor3.describe()))
    floor3.close()
    rows.append(Row("refcntd counting, -O2 stubs, --probe-mode entry",
                    **clocked(r, lambda: traced(o2, "getput", n, ["--probe-mode", "entry"]))))
    lib_floor = Floor(lib, spec=str(b["bench-lib.yaml"]))
    rows.append(Row("uprobe floor on the exported -O2 stubs' PLT call sites", repeat(
        r, lambda: untraced(lib, "getput", n)), note=lib_floor.describe()))
    lib_floor.close()
    rows.append(Row("refcntd counting, -O2 stubs exported by a library (PLT callers)",
                    **clocked(r, lambda: traced(lib, "getput", n,
                                                ["--spec", str(b["bench-lib.yaml"])])),
                    ratio_to="uprobe floor on the exported -O2 stubs' PLT call sites",
                    note="call-site probes in the program, on its calls to the PLT stubs"))
    if per_call_only:
        return {"rows": rows}
    rows.append(Row("USDT probes, semaphore off (not traced)", repeat(
        r, lambda: untraced(b["bench-usdt"], "usdt", n))))
    rows.append(Row("refcntd on USDT probes, semaphore on", repeat(
        r, lambda: traced(b["bench-usdt"], "usdt", n,
                          ["--spec", str(b["bench-usdt.yaml"])])[0]),
        ratio_to="uprobe floor: empty program, same instructions"))
    rows.append(Row("LD_PRELOAD interposer (user-space hash), PLT stubs", repeat(
        r, lambda: untraced(lib, "getput", n, dict(os.environ,
                                                   LD_PRELOAD=str(b["interposer.so"]))))))
    rows.append(Row("malloc/free, no tracer", repeat(r, lambda: untraced(o0, "malloc", n))))
    rows.append(Row("bcc memleak (-p PID) on malloc/free", repeat(
        r, lambda: memleak(o0, n)), note="per malloc or free call"))
    thread_runs = [traced(o0, "threads", n) for _ in range(r)]
    exact = all("counts 1 1 1 1" in out for _, out, _ in thread_runs)
    rows.append(Row("2 threads sharing 4 objects, refcntd counting",
                    [ns for ns, _, _ in thread_runs], extra={"counts_exact": exact},
                    note=f"final counts exact: {exact}"))
    results = {"rows": rows, "scale": [scale(o0, k, out) for k in sizes.scale],
               "map_memory": map_bytes_per_object(min(100_000, max(sizes.scale))),
               "attach_s": statistics.median(repeat(min(3, r), lambda: attach_time(
                   b["librefcnt.so"]))),
               "attach_sites": [attach_sites(k, out) for k in sizes.sites],
               "xol_mappings_entry_probes": xol_mapping(o0),
               "perflike": {
                   "samples": sizes.perflike_samples,
                   "untraced_s": wall([str(b["perflike"]), str(sizes.perflike_samples)]),
                   "traced_tiny_s": wall([*REFCNTD, "run", "--", str(b["perflike"]), "10"]),
                   "traced_s": wall([*REFCNTD, "run", "--", str(b["perflike"]),
                                     str(sizes.perflike_samples)]),
                   "traced_history_s": wall([*REFCNTD, "run", "--history", "--",
                                             str(b["perflike"]), str(sizes.perflike_samples)])}}
    return results


# ---- output ------------------------------------------------------------------------
def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    mem = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
    return {"kernel": platform.release(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_gib": round(mem / 2**20, 1), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "commit": git_head(ROOT),
            "load": [round(x, 2) for x in os.getloadavg()]}


def git_head(tree: Path) -> str:
    """The checkout's commit, short ("" outside a git checkout): each results page says
    which code it measured."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def write_results(out: Path, stem: str, text: str, rows: list[dict]) -> None:
    """`stem`.md (the table) and `stem`.json (the rows, with the machine), printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"machine": machine(), "rows": rows},
                                                 indent=2))
    print(text)


def row_json(row: Row, by_name: dict[str, Row]) -> dict:
    base = by_name.get(row.ratio_to) or by_name["uprobe floor: empty program, same instructions"]
    return {"name": row.name, "unit": row.unit, "median": round(row.median, 1),
            "min": round(min(row.values), 1), "max": round(max(row.values), 1),
            "runs": len(row.values), "ratio_to_floor": round(row.median / base.median, 2),
            "floor_row": base.name, "note": row.note,
            "bpf_ns_per_run": round(statistics.median(row.bpf), 1) if row.bpf else None,
            **row.extra}


def goals(results: dict, rows: dict[str, dict]) -> list[dict]:
    counting = rows["refcntd counting"]["median"]
    memleak_op = rows["bcc memleak (-p PID) on malloc/free"]["median"] - \
        rows["malloc/free, no tracer"]["median"]
    ours_op = counting - rows["no tracer (-O0 stubs)"]["median"]
    big = max(results["scale"], key=lambda s: s["objects"])
    per_obj = results["map_memory"]["bytes_per_object"]
    shared = per_call_goals(rows)
    return [
        shared[0],
        {"goal": "no [uprobes] XOL mapping in an entry-probe-only run (-O0 stubs)",
         "value": f"{results['xol_mappings_entry_probes']} mapping(s)",
         "met": results["xol_mappings_entry_probes"] == 0},
        {"goal": "per operation >= 5x cheaper than bcc memleak", "value":
         f"{memleak_op / ours_op:.1f}x cheaper ({ours_op:.0f} vs {memleak_op:.0f} ns added)",
         "met": memleak_op / ours_op >= 5},
        {"goal": f"report of {big['objects']} live objects within 3 s of exit",
         "value": f"{big['exit_to_report_s']:.2f} s", "met": big["exit_to_report_s"] <= 3
         and big["objects"] >= 1_000_000},
        {"goal": "kernel memory <= 128 bytes per tracked object", "value":
         f"{per_obj:.0f} bytes", "met": per_obj <= 128},
        {"goal": "attach <= 1.5 s for the default spec", "value":
         f"{results['attach_s']:.2f} s", "met": results["attach_s"] <= 1.5},
        *shared[1:],
    ]


def _ms(seconds: float | None) -> str:
    return "not run" if seconds is None else f"{seconds * 1000:.1f} ms"


def attach_sites_table(rows: list[dict]) -> list[str]:
    md = ["Attach time against the number of call sites (-O2 get stub called from N places; "
          "`check` and `attach` pick call-site probes):", "",
          "| call sites | plan (code sweep) | one multi-uprobe link | one perf event per site "
          "| detach (multi / per site) | `refcntd attach` start to attached |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['call_sites']} | {r['plan_s']:.2f} s | {r['multi_link_s'] * 1000:.1f} ms | "
           f"{_ms(r['per_site_perf_events_s'])} | {r['detach_multi_s'] * 1000:.1f} ms / "
           f"{_ms(r['detach_per_site_s'])} | {r['refcntd_attach_s']:.2f} s |" for r in rows]
    return [*md, ""]


def rows_table(results: dict, sizes: Sizes, title: str) -> tuple[list[str], dict[str, dict]]:
    """The heading, the machine and the per-row table (JSON rows by name)."""
    by_name = {r.name: r for r in results["rows"]}
    rows = {r.name: row_json(r, by_name) for r in results["rows"]}
    md = [f"# {title} ({'smoke' if sizes is SMOKE else 'full'} size)", "",
          "Machine: " + ", ".join(f"{k} {v}" for k, v in machine().items()), "",
          f"{sizes.runs} runs of {sizes.calls} get+put pairs each (churn: {sizes.churn} "
          "init+release pairs); median and min-max of the runs; ratios against the uprobe "
          "floor measured in the same run; BPF ns/run: the time inside refcntd's probe "
          "programs per probe hit (kernel.bpf_stats_enabled), median of the runs.", "",
          "| workload | median | min-max | unit | x floor | BPF ns/run | note |",
          "|---|---|---|---|---|---|---|"]
    for r in rows.values():
        md.append(f"| {r['name']} | {r['median']} | {r['min']}-{r['max']} | {r['unit']} | "
                  f"{r['ratio_to_floor']} | {r['bpf_ns_per_run'] or '-'} | {r['note']} |")
    return md, rows


def per_call_goals(rows: dict[str, dict]) -> list[dict]:
    floor = rows["uprobe floor: empty program, same instructions"]["median"]
    o2 = rows["refcntd counting, -O2 lock-prefixed stubs"]["median"]
    o2_floor = rows["uprobe floor on the -O2 build's probe points"]["median"]
    exported = rows["refcntd counting, -O2 stubs exported by a library (PLT callers)"]
    counting = rows["refcntd counting"]["median"]
    return [
        {"goal": "counting only <= 1.15x the uprobe floor", "value":
         f"{counting / floor:.2f}x", "met": counting / floor <= 1.15},
        {"goal": "-O2 lock-prefixed stubs: counting <= 1.2x the uprobe floor", "value":
         f"{o2 / floor:.2f}x (of its own probe points' floor: {o2 / o2_floor:.2f}x)",
         "met": o2 / floor <= 1.2},
        {"goal": "-O2 stubs exported by a library: counting <= 1.2x the uprobe floor",
         "value": f"{exported['median'] / floor:.2f}x (of its own probe points' floor: "
         f"{exported['ratio_to_floor']:.2f}x)", "met": exported["median"] / floor <= 1.2},
    ]


def render_per_call(results: dict, sizes: Sizes) -> tuple[str, dict]:
    md, rows = rows_table(results, sizes, "refcntd per-call cost")
    g = per_call_goals(rows)
    md += ["", "| goal | measured | met |", "|---|---|---|"]
    md += [f"| {x['goal']} | {x['value']} | {'yes' if x['met'] else '**no**'} |" for x in g]
    return "\n".join(md) + "\n", {"machine": machine(), "rows": list(rows.values()),
                                   "goals": g}


def render(results: dict, sizes: Sizes) -> tuple[str, dict]:
    md, rows = rows_table(results, sizes, "refcntd benchmark results")
    g = goals(results, rows)
    md += ["", "| live objects at exit | exit to process report | exit to run JSON | "
           "run JSON | refcntd max RSS |", "|---|---|---|---|---|"]
    md += [f"| {s['objects']} ({s['leaked_reported']} reported) | {s['exit_to_report_s']:.2f} s"
           f" | {s['exit_to_run_json_s']:.2f} s | {s['run_json_mib']} MiB | "
           f"{s['maxrss_mib']:.0f} MiB |" for s in results["scale"]]
    mm, pl = results["map_memory"], results["perflike"]
    md += ["", f"Object map kernel memory: {mm['bytes_per_object']:.0f} bytes per object "
           f"(memlock {mm['bytes_before']} -> {mm['bytes_after']} bytes for {mm['entries']} "
           "entries).", f"Attach time (start to all probes installed, default spec): "
           f"{results['attach_s']:.2f} s.", f"[uprobes] XOL mappings in an entry-probe-only "
           f"target: {results['xol_mappings_entry_probes']}.", "",
           f"Real workload, perflike (-O2 stubs: call-site probes) with {pl['samples']} "
           f"samples: untraced {pl['untraced_s']:.2f} s, refcntd run {pl['traced_s']:.2f} s, "
           f"with --history {pl['traced_history_s']:.2f} s (wall); refcntd's own start and "
           f"exit (the same with 10 samples) {pl['traced_tiny_s']:.2f} s.", "",
           "| goal | measured | met |", "|---|---|---|"]
    md[-2:-2] = attach_sites_table(results["attach_sites"])
    md += [f"| {x['goal']} | {x['value']} | {'yes' if x['met'] else '**no**'} |" for x in g]
    data = {"machine": machine(), "sizes": vars(sizes) | {"scale": list(sizes.scale)},
            "rows": list(rows.values()), "scale": results["scale"],
            "map_memory": results["map_memory"], "attach_s": results["attach_s"],
            "attach_sites": results["attach_sites"],
            "xol_mappings_entry_probes": results["xol_mappings_entry_probes"],
            "perflike": results["perflike"], "goals": g}
    return "\n".join(md) + "\n", data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    parser.add_argument("--out", default=str(HERE / "results"), help="output directory")
    parser.add_argument("--per-call", action="store_true",
                        help="only the per-call rows (-O0, -O2, exported -O2) and their floors;"
                             " written as per-call.md/json")
    parser.add_argument("--bpf-time", action="store_true",
                        help="also time refcntd's probe programs inside BPF "
                             "(kernel.bpf_stats_enabled, which adds its own cost to every run)")
    args = parser.parse_args()
    ProbeClock.enabled = args.bpf_time
    if os.geteuid() != 0:
        print("benchmarks/run.py: needs root (BPF)", file=sys.stderr)
        return 1
    sizes = SMOKE if args.smoke else FULL
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="refcntd-bench-") as scratch:  # builds, big JSON
        results = measure(sizes, Path(scratch), args.per_call)
        md, data = render_per_call(results, sizes) if args.per_call else render(results, sizes)
    name = "per-call" if args.per_call else "results"
    (out / f"{name}.md").write_text(md)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
