"""refcntd on a binary as big as a real one (>= 1M DWARF DIEs, like perf 6.1).

    .venv/bin/python benchmarks/bigbinary.py [--smoke] [--out DIR] [--before TREE]

Builds the generated program (benchmarks/bigsource.py), then measures, each
in a fresh process (wall time and peak RSS from wait4):

* the candidate DWARF scans (benchmarks/dwarfscan.py) on the same binary;
* `refcntd check` cold (empty cache) and warm, for the default spec and for
  the obj_* spec whose inlined copies and clones the binary carries;
* with root, `refcntd attach` until its probes are installed: the very first
  start (nothing cached: full BPF compile), a binary never analysed (the BPF
  programs cached, as `refcntd prebuild` leaves them), and warm;
* each `check` and attach row REPEATS times (`--repeats`), reported as the
  median with the range;
* with `--before TREE` (a checkout of an older refcntd), the same `check`
  there, as the baseline.

Writes bigbinary.md and bigbinary.json into DIR (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bigsource  # noqa: E402
from dwarfscan import CANDIDATES  # noqa: E402

OBJ_NAMES = ["obj_init", "obj_get", "obj_put"]
SPECS = ("perf-stubs", "example-objapi")


def candidates(exe: Path) -> list[dict[str, object]]:
    rows = []
    for name in CANDIDATES:
        run = _reaped([sys.executable, str(HERE / "dwarfscan.py"), name, str(exe), *OBJ_NAMES])
        found = json.loads(run["stdout"]) if run["status"] == 0 else {"error": run["stderr"]}
        rows.append({"candidate": name, "seconds": run["seconds"], "rss_mib": run["rss_mib"],
                     "scan_seconds": round(found.get("seconds", 0.0), 3),
                     "found": found.get("found", found.get("error"))})
    return rows


def _reaped(cmd: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None
            ) -> dict[str, object]:
    """Run cmd to its end, reaped with wait4 for its own peak RSS; wall seconds, output."""
    t0 = time.monotonic()
    out_f, err_f = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out_f, stderr=err_f, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    out_f.seek(0)
    err_f.seek(0)
    return {"seconds": round(wall, 3), "rss_mib": round(usage.ru_maxrss / 1024, 1),
            "status": proc.returncode, "stdout": out_f.read(), "stderr": err_f.read()[-2000:]}


def check_runs(exe: Path, tree: Path, label: str, repeats: int) -> list[dict[str, object]]:
    """Per spec: `check` cold (a new cache directory) then warm, `repeats` times."""
    rows = []
    for spec in SPECS:
        runs: dict[str, list[dict[str, object]]] = {"cold": [], "warm": []}
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, REFCNTD_CACHE=cache)
                for temp in ("cold", "warm"):
                    runs[temp].append(_reaped([sys.executable, "-m", "refcntd", "check",
                                               "--binary", str(exe), "--spec", spec],
                                              cwd=tree, env=env))
        for temp, done in runs.items():
            last = done[-1]
            rows.append({"refcntd": label, "spec": spec, "cache": temp, **_spread(done),
                         "status": last["status"],
                         "inlined": "inlined at" in str(last["stdout"]),
                         "cached": "from the analysis cache" in str(last["stdout"]),
                         "incomplete": "INCOMPLETE" in str(last["stdout"])})
    return rows


def _spread(runs: list[dict[str, object]]) -> dict[str, object]:
    """Median seconds and peak RSS of repeated runs, with the range of the seconds."""
    secs = sorted(float(r["seconds"]) for r in runs)  # type: ignore[arg-type]
    rss = sorted(float(r["rss_mib"]) for r in runs)  # type: ignore[arg-type]
    return {"seconds": secs[len(secs) // 2], "range": f"{secs[0]}-{secs[-1]}",
            "rss_mib": rss[len(rss) // 2], "runs": len(runs)}


ATTACH_CACHES = ("first start on the machine: empty cache (DWARF scan and full BPF compile)",
                 "cold: binary never analysed, BPF programs cached (as prebuild leaves them)",
                 "warm: both caches")


def bcc_baseline() -> dict[str, object]:
    """Peak RSS of bcc alone (import, compile and load a trivial program): the goal is
    refcntd's attach <= this + 200 MiB."""
    code = ("from refcntd.kernel import setup; setup.prepare(); import bcc; "
            "bcc.BPF(text=b'int f(void *ctx) { return 0; }').cleanup()")
    run = _reaped([sys.executable, "-c", code])
    return {"seconds": run["seconds"], "rss_mib": run["rss_mib"], "status": run["status"]}


def attach_times(exe: Path, repeats: int) -> list[dict[str, object]]:
    """`refcntd attach` with each cache temperature (ATTACH_CACHES), in one cache dir:
    the first start once, then `repeats` cold starts (the DWARF answers, call-site
    scans and ld.so plans dropped before each, the compiled programs kept) and warm
    ones."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, REFCNTD_CACHE=cache)
        rows = []
        for label in ATTACH_CACHES:
            runs = []
            for _ in range(1 if label.startswith("first") else repeats):
                if label.startswith("cold"):  # all but bpf/ and the kernel headers
                    for entry in [*(Path(cache) / "analysis").glob("*"),
                                  *Path(cache).glob("callsites-*.json"),
                                  *Path(cache).glob("ldso-*.json")]:
                        entry.unlink()
                runs.append(attach_time(exe, env))
            rows.append({"cache": label, **runs[-1], **_spread(runs)})
        return rows


def attach_time(exe: Path, env: dict[str, str]) -> dict[str, object]:
    """Start of `refcntd attach` to its 'attached' line (every probe installed: from
    then on the BPF program counts every call itself)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "refcntd", "attach", "--verbose",
                             "--binary", str(exe)], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line, stages = proc.stderr.readline(), []
    while line and "attached" not in line:  # after the --verbose lines
        stages.append(line.strip())
        line = proc.stderr.readline()
    elapsed = time.monotonic() - t0
    if "attached" not in line:
        raise RuntimeError(f"attach ended before attaching: {stages[-5:]} {proc.stderr.read()}")
    os.kill(proc.pid, signal.SIGINT)  # not proc.send_signal: it reaps, and wait4 must
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": round(elapsed, 3), "rss_mib": round(usage.ru_maxrss / 1024, 1),
            "ready": "attached" in line, "line": line.strip(), "stages": stages}


def measure(shape: bigsource.Shape, out: Path, before: Path | None, attach: bool,
            repeats: int) -> dict[str, object]:
    exe = bigsource.build(out / "bigbuild", shape)
    data: dict[str, object] = {"dies": bigsource.count_dies(exe), "shape": vars(shape),
                               "binary_mib": round(exe.stat().st_size / 2**20, 1)}
    data["candidates"] = candidates(exe)
    data["check"] = check_runs(exe, ROOT, "this tree", repeats)
    if before is not None:
        data["check"] += check_runs(exe, before, "before", repeats)
    if attach and os.geteuid() == 0:
        data["attach"] = attach_times(exe, repeats)
        data["bcc_baseline"] = bcc_baseline()
    return data


def render(data: dict[str, object], machine: dict[str, object]) -> str:
    lines = ["# refcntd on a big binary", "",
             f"Machine: {machine}", "",
             f"Generated program: {data['shape']}, {data['dies']:,} DWARF DIEs, "
             f"{data['binary_mib']} MiB (`gcc -g -O2`).", "",
             "## Finding inlined copies of obj_init/obj_get/obj_put (one fresh process each)",
             "", "| candidate | wall s (incl. start) | scan s | peak RSS MiB | found |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['candidate']} | {r['seconds']} | {r['scan_seconds']} | {r['rss_mib']} | "
              f"{json.dumps(r['found'])} |" for r in data["candidates"]]  # type: ignore[attr-defined]
    lines += ["", "## `refcntd check --binary` (fresh process each; cold: a new cache "
              "directory; median of the runs)", "",
              "| refcntd | spec | cache | wall s (median) | range | runs | peak RSS MiB | exit | "
              "inlined copies reported | scan incomplete | DWARF from cache |",
              "|---" * 11 + "|"]
    lines += [f"| {r['refcntd']} | {r['spec']} | {r['cache']} | {r['seconds']} | "
              f"{r.get('range', '-')} | {r.get('runs', 1)} | "
              f"{r['rss_mib']} | {r['status']} | {r['inlined']} | {r['incomplete']} | "
              f"{r.get('cached', '-')} |"
              for r in data["check"]]  # type: ignore[attr-defined]
    if "bcc_baseline" in data:
        base = data["bcc_baseline"]
        lines.append(f"\nbcc alone (import, compile and load a trivial program): peak RSS "
                     f"{base['rss_mib']} MiB, {base['seconds']} s")  # type: ignore[index]
    for r in data.get("attach", []):  # type: ignore[attr-defined]
        lines.append(f"\nattach to probes installed, {r.get('cache', '?')}: {r['seconds']} s "
                     f"(median of {r.get('runs', 1)}, range {r.get('range', '-')} s), "
                     f"peak RSS {r['rss_mib']} MiB; --verbose said (last run):")
        lines += [f"    {stage}" for stage in r["stages"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny program (seconds)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--build", type=Path, help="where to build (default: OUT)")
    parser.add_argument("--before", type=Path, help="an older refcntd checkout, as baseline")
    parser.add_argument("--no-attach", action="store_true", help="skip the attach timing")
    parser.add_argument("--repeats", type=int, help="runs per check/attach row "
                                                     "(default 5, 1 with --smoke)")
    args = parser.parse_args()
    from run import machine
    shape = bigsource.SMOKE if args.smoke else bigsource.FULL
    repeats = args.repeats or (1 if args.smoke else 5)
    data = measure(shape, args.build or args.out, args.before, not args.no_attach, repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "bigbinary-smoke" if args.smoke else "bigbinary"
    text = render(data, machine())
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(json.dumps(data | {"machine": machine()}, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
