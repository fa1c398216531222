"""The README's two commands on fresh Debian userlands: Debian 12 and Debian 13.

For each release: `debootstrap --variant=minbase` from the Debian registry into
WORK/RELEASE (made fresh each run), the release's own apt sources (updates and
security), this machine's CA certificates (the registries are reached through a
TLS proxy here; pip is told where they are), proc, sys and dev mounted into it,
and a clone of this repository at its HEAD commit.  Then, as root inside the
chroot on the host's kernel: `bash scripts/demo.sh` (the report must be exact:
exit 23, 8 objects of 3 types, nothing lost, an ld.so probe) and `bash
scripts/test.sh tests/unit` (ruff, import-linter, mypy, the ABI check and the
unit tier; `--case bpf` adds the given BPF test files; `--case suite` is the
whole `bash scripts/test.sh`, BPF tier included, with REFCNTD_REQUIRE_BPF=1, its
output kept in the chroot's /root/suite.log as it runs).  Writes
benchmarks/results/distros.md and .json; a release not run keeps its earlier
row, with the date and commit it was measured at.  Everything it mounts is
unmounted at the end, also after a failure.

    python benchmarks/distros.py                                   # both releases
    python benchmarks/distros.py --release trixie --case demo --case unit   # CI's step
    python benchmarks/distros.py --release trixie --case suite --keep       # the whole suite
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
NAMES = {"bookworm": "Debian 12", "trixie": "Debian 13"}
CASES = ("demo", "unit", "suite", "bpf")
SUITE_TIMEOUT = 4 * 3600  # the whole suite took 31 min on the host at load 4-7
HOST_CA = Path("/usr/local/share/ca-certificates")
PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore


def must(cmd: list[str], **kw: object) -> str:
    done = sh(cmd, **kw)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-400:]}")
    return done.stdout


def bootstrap(root: Path, release: str) -> float:
    """A fresh minbase userland at `root` with its sources, CAs, git; seconds taken."""
    if root.exists():
        shutil.rmtree(root)
    start = time.monotonic()
    must(["debootstrap", "--variant=minbase", release, str(root), MIRROR])
    (root / "etc/apt/sources.list").write_text(
        f"deb {MIRROR} {release} main\ndeb {MIRROR} {release}-updates main\n"
        f"deb {SECURITY} {release}-security main\n")
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    return time.monotonic() - start


def mount(root: Path) -> None:
    # the root a mount point of its own: `unshare -m` inside (tests/bpf/test_symbols.py)
    # fails with "cannot change root filesystem propagation" otherwise
    must(["mount", "--bind", str(root), str(root)])
    must(["mount", "--make-private", str(root)])
    must(["mount", "-t", "proc", "proc", str(root / "proc")])
    for tree in ("sys", "dev"):  # rslave: unmounting them here never reaches the host
        must(["mount", "--rbind", f"/{tree}", str(root / tree)])
        must(["mount", "--make-rslave", str(root / tree)])


def unmount(root: Path) -> None:
    for tree in ("dev", "sys", "proc"):
        if sh(["mountpoint", "-q", str(root / tree)]).returncode == 0:
            if sh(["umount", "-R", str(root / tree)]).returncode != 0:
                sh(["umount", "-R", "-l", str(root / tree)])
    if sh(["mountpoint", "-q", str(root)]).returncode == 0:
        sh(["umount", str(root)])


def chroot(root: Path, script: str, timeout: float = 3600) -> tuple[int, str, float]:
    """Run bash `script` as root in the chroot with a clean environment."""
    env = {"PATH": PATH, "HOME": "/root", "TERM": "dumb", "LANG": "C.UTF-8",
           "REFCNTD_REQUIRE_BPF": "1"}
    start = time.monotonic()
    done = subprocess.run(["chroot", str(root), "bash", "-c", script], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def prepare(root: Path, commit: str) -> None:
    """ca-certificates, git, this machine's CAs and pip's cert; the repo's clone."""
    code, out, _ = chroot(root, "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq"
                                " && apt-get install -y -qq ca-certificates git >/dev/null")
    if code:
        raise RuntimeError(f"apt-get in the chroot: {out.strip()[-400:]}")
    cas = root / "usr/local/share/ca-certificates"
    cas.mkdir(parents=True, exist_ok=True)
    for crt in HOST_CA.glob("*.crt"):
        shutil.copy(crt, cas / crt.name)
    chroot(root, "update-ca-certificates >/dev/null")
    (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    clone = root / "root/refcntd"
    must(["git", "clone", "-q", str(ROOT), str(clone)])
    must(["git", "-C", str(clone), "checkout", "-q", commit])


def facts(root: Path) -> dict[str, str]:
    """What the userland is made of: its release and the versions refcntd meets."""
    _, out, _ = chroot(root, "cat /etc/debian_version; python3 --version; "
                             "dpkg-query -W -f='${Version}\\n' python3-bpfcc libc6 gcc "
                             "libglib2.0-0t64 libglib2.0-0 2>/dev/null; true")
    lines = out.split()
    return {"debian_version": lines[0] if lines else "?",
            "python": " ".join(lines[1:3]) if len(lines) > 2 else "?",
            "packages": " ".join(lines[3:])}


def demo(root: Path) -> dict[str, object]:
    code, out, secs = chroot(root, "cd /root/refcntd && bash scripts/demo.sh")
    summary = re.search(r"SUMMARY: refcntd: (\d+) objects of (\d+) types", out)
    exact = (code == 0 and summary is not None and summary.groups() == ("8", "3")
             and "nothing lost" in out and "no ld.so probe" not in out)
    notes = re.findall(r"^\s+note: (.*)$", out, re.M)
    return {"ok": exact, "exit": code, "seconds": round(secs, 1),
            "summary": summary[0] if summary else "", "ldso_probe": "no ld.so probe" not in out,
            "notes": notes, "tail": out.strip().splitlines()[-3:]}


def pytest_case(root: Path, command: str, timeout: float = 3600) -> dict[str, object]:
    code, out, secs = chroot(root, f"cd /root/refcntd && {command}", timeout)
    totals = [line for line in out.splitlines()
              if re.search(r"\d+ (passed|failed|errors?)\b.* in [\d.]+s", line)]
    counts = {k: int(v) for v, k in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|xfailed)", totals[-1] if totals else "")}
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    return {"ok": code == 0, "exit": code, "seconds": round(secs, 1), "counts": counts,
            "failed": failed, "tail": out.strip().splitlines()[-3:]}


def run_release(work: Path, release: str, cases: list[str], bpf_tests: list[str],
                commit: str, keep: bool) -> dict[str, object]:
    root = work / release
    result: dict[str, object] = {"release": release, "name": NAMES.get(release, release)}
    try:
        result["debootstrap_s"] = round(bootstrap(root, release), 1)
        mount(root)
        prepare(root, commit)
        start = time.monotonic()
        code, out, secs = chroot(root, "cd /root/refcntd && bash scripts/setup.sh")
        result["setup"] = {"ok": code == 0, "seconds": round(secs, 1),
                           "tail": out.strip().splitlines()[-2:]}
        result.update(facts(root))
        if "demo" in cases:
            result["demo"] = demo(root)
        if "unit" in cases:
            result["unit"] = pytest_case(root, "bash scripts/test.sh tests/unit -q -p "
                                               "no:cacheprovider")
        if "suite" in cases:
            result["suite"] = pytest_case(
                root, "set -o pipefail; bash scripts/test.sh -q -p no:cacheprovider 2>&1"
                      " | tee /root/suite.log", SUITE_TIMEOUT)
        if "bpf" in cases and bpf_tests:
            result["bpf"] = pytest_case(root, ".venv/bin/python -m pytest -q -p "
                                              "no:cacheprovider " + " ".join(bpf_tests))
        result["total_s"] = round(time.monotonic() - start + float(
            str(result["debootstrap_s"])), 1)
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        result["error"] = str(err)
    finally:
        unmount(root)
        if not keep and root.exists() and not any(
                sh(["mountpoint", "-q", str(root / t)]).returncode == 0
                for t in ("proc", "sys", "dev", ".")):
            shutil.rmtree(root, ignore_errors=True)
    return result


def cell(case: object) -> str:
    if not isinstance(case, dict):
        return "not run"
    verdict = "ok" if case.get("ok") else "FAIL"
    counts = case.get("counts")
    detail = ", ".join(f"{v} {k}" for k, v in counts.items()) if counts else case.get(
        "summary", "")
    return f"{verdict} {case.get('seconds')} s" + (f" ({detail})" if detail else "")


def merged(results: list[dict[str, object]], meta: dict[str, object],
           out: Path) -> list[dict[str, object]]:
    """This run's releases, each stamped with `meta`, and the earlier rows of the others."""
    earlier: list[dict[str, object]] = []
    if out.with_suffix(".json").exists():
        old = json.loads(out.with_suffix(".json").read_text())
        for r in old.get("releases", []):
            r.setdefault("measured", old.get("meta", {}))  # rows written before per-row stamps
            earlier.append(r)
    now = {str(r["release"]): {**r, "measured": meta} for r in results}
    kept = [r for r in earlier if r["release"] not in now]
    return sorted([*kept, *now.values()], key=lambda r: list(NAMES).index(str(r["release"])))


def write(results: list[dict[str, object]], meta: dict[str, object], out: Path) -> None:
    rows = merged(results, meta, out)
    out.with_suffix(".json").write_text(json.dumps({"releases": rows}, indent=1) + "\n")
    lines = ["# The README's commands on fresh Debian userlands (benchmarks/distros.py)", "",
             "Each release made fresh with `debootstrap --variant=minbase` from the Debian",
             "registry, run as a chroot on this machine's kernel (proc, sys, dev mounted in),",
             "from a clone of the repository at the commit given.  `demo` is `bash",
             "scripts/demo.sh` (exact: exit 23, 8 objects of 3 types, nothing lost, an ld.so",
             "probe); `unit` is `bash scripts/test.sh tests/unit` (ruff, import-linter, mypy,",
             "the ABI check, the unit tier); `suite` is the whole `bash scripts/test.sh`, BPF",
             "tier included (REFCNTD_REQUIRE_BPF=1, 2 pytest-xdist workers).  Seconds are wall",
             "time; setup includes apt.", ""]
    for r in rows:
        m = r["measured"]
        assert isinstance(m, dict)
        lines.append(f"{r['name']} measured {m.get('date')} at commit {m.get('commit')} on "
                     f"{m.get('machine')}; load average before: {m.get('load_before')}, "
                     f"after: {m.get('load_after')}.")
        lines.append("")
    lines += ["| release | userland | debootstrap | setup | demo | unit | suite | bpf |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} ({r['release']}) | {r.get('debian_version', '?')}, "
                     f"{r.get('python', '?')} | {r.get('debootstrap_s', '?')} s | "
                     + " | ".join(cell(r.get(c)) for c in ("setup", "demo", "unit", "suite",
                                                           "bpf")) + " |")
    lines.append("")
    for r in rows:
        if "error" in r:
            lines.append(f"* {r['name']}: **error**: {r['error']}")
        for case in ("demo", "unit", "suite", "bpf"):
            c = r.get(case)
            if isinstance(c, dict):
                for f in c.get("failed", []) or []:
                    lines.append(f"* {r['name']}, {case}: failed {f}")
                for n in c.get("notes", []) or []:
                    lines.append(f"* {r['name']}, {case}: note: {n}")
        lines.append(f"* {r['name']}: packages (gcc libc6 libglib python3-bpfcc): "
                     f"{r.get('packages', '?')}")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", action="append", choices=sorted(NAMES),
                        help="default: bookworm and trixie")
    parser.add_argument("--case", action="append", choices=CASES,
                        help="default: demo and unit; suite is the whole test.sh")
    parser.add_argument("--bpf-test", action="append", default=[],
                        help="a tests/bpf file or node id for --case bpf")
    parser.add_argument("--work", type=Path, default=Path("/var/lib/refcntd-distros"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "distros")
    parser.add_argument("--keep", action="store_true", help="keep the userlands")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("distros.py: run as root (debootstrap, chroot, mounts)", file=sys.stderr)
        return 2
    if shutil.which("debootstrap") is None:
        must(["apt-get", "install", "-y", "-qq", "debootstrap"],
             env={"DEBIAN_FRONTEND": "noninteractive", "PATH": PATH})
    commit = must(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).strip()
    cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    meta: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit[:12],
        "machine": f"{platform.node()}, Linux {platform.release()}, {os.cpu_count()} CPU "
                   f"({cpu[1] if cpu else '?'})",
        "load_before": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
    args.work.mkdir(parents=True, exist_ok=True)
    results = [run_release(args.work, rel, args.case or ["demo", "unit"], args.bpf_test,
                           commit, args.keep) for rel in args.release or list(NAMES)]
    meta["load_after"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    write(results, meta, args.out)
    ok = all(isinstance(r.get(c), dict) and r[c]["ok"]  # type: ignore[index]
             for r in results for c in (args.case or ["demo", "unit"]))
    print(args.out.with_suffix(".md").read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
