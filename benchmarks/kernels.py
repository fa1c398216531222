"""The kernel matrix: refcntd's smoke set on each kernel Debian offers this release.

Boots each of Debian's own kernels (bookworm's 6.1, bookworm-security's 6.12: the
newest of each series in the archive, or those named) under QEMU with virtme-ng,
over this machine's root file system, and runs benchmarks/kernels_guest.py there:
prebuild, check, the README's demo (exact report), --history's culprit, the CI
audit with SARIF, a USDT probe behind a semaphore, attach on a library, serve's
/metrics.  The same cases run on the host's kernel first, for comparison.  Writes
benchmarks/results/kernels.md.

Installs its own tools: qemu-system-x86 and busybox-static from Debian, virtme-ng
from PyPI (a venv in WORK).  The kernels' packages are downloaded with apt and
unpacked under WORK, never installed: the host's /boot, /lib/modules and /usr/src
stay as they were (a 6.12 header tree in /usr/src would change what other
checkouts on this machine compile against).  Inside the guest, /usr/src gets links
to the unpacked headers, as installing them would give.

There is no KVM here: QEMU runs TCG (a boot ~30 s, a cold bcc compile ~5 min).
Compiled programs are kept per kernel in WORK/cache-RELEASE (the guest's
/var/cache/refcntd), so a second matrix run skips the compile.  The merged kernel
header tree refcntd keeps there is made on the host before each boot, by refcntd's
own code (premerge): the guest finds it ready.  Made by the guest on the 9p share,
its ~16 000 symlinks took 18 min (6.1) and over 30 min (6.12).

    python benchmarks/kernels.py                      # every series, every case
    python benchmarks/kernels.py --kernel 6.1 --case demo --no-host   # CI's step
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
WORK = Path("/var/lib/refcntd-kernels")  # not /var/cache: a tmpfs inside the guest
LIBS = "/usr/lib/x86_64-linux-gnu"
DEBIAN_TOOLS = ("qemu-system-x86", "busybox-static")
IMAGE = re.compile(r"^linux-image-(\d+\.\d+\.\d+(?:-\d+|\+deb\d+))-amd64$")


def sh(cmd: list[str], **kw: object) -> str:
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)  # type: ignore
    return done.stdout


def install_tools(work: Path) -> Path:
    """qemu and busybox from Debian, virtme-ng from PyPI; vng's path."""
    missing = [p for p in DEBIAN_TOOLS if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True
    ).stdout != "install ok installed"]
    if missing:
        sh(["apt-get", "update", "-qq"])
        sh(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
           env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    vng = work / "venv/bin/vng"
    if not vng.exists():
        sh(["/usr/bin/python3", "-m", "venv", str(work / "venv")])
        sh([str(work / "venv/bin/pip"), "install", "-q", "virtme-ng"])
    return vng


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release))


APT: list[str] = []  # apt's options for the suites given with --suite (apt_suites)


def apt_suites(work: Path, suites: list[str]) -> None:
    """Debian suites beside the host's own (trixie-backports, sid: the newest kernels
    Debian offers), read into a private apt state under WORK: the host's sources and
    lists stay as they are."""
    if not suites:
        return
    state = work / "apt"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    host = [line for f in [Path("/etc/apt/sources.list"),
                           *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
            if f.is_file() for line in _deb_lines(f.read_text())]
    sources.write_text("\n".join([*host, *(f"deb http://deb.debian.org/debian {s} main"
                                           for s in suites)]) + "\n")
    APT[:] = ["-o", f"Dir::Etc::sourcelist={sources}", "-o", "Dir::Etc::sourceparts=-",
              "-o", f"Dir::State::Lists={state / 'lists'}"]
    sh(["apt-get", "-qq", *APT, "update"])


def _deb_lines(text: str) -> list[str]:
    """One-line `deb` entries of a sources file, deb822 stanzas (Debian 12's) included."""
    out = [line.strip() for line in text.splitlines() if line.strip().startswith("deb ")]
    for stanza in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in stanza.splitlines()
                      if ":" in line and not line.startswith((" ", "#")))
        if fields.get("Types", "").strip() == "deb" and "URIs" in fields:
            for suite in fields.get("Suites", "").split():
                out.append(f"deb {fields['URIs'].strip()} {suite} "
                           f"{fields.get('Components', 'main').strip()}")
    return out


def debian_kernels(exact: tuple[str, ...] = ()) -> list[str]:
    """The newest linux-image-*-amd64 of each series the archive offers (6.1, 6.12, and
    with --suite the newer ones), and the releases named exactly (`exact`: the oldest
    the archive still offers, say)."""
    listing = sh(["apt-cache", *APT, "search", "--names-only", r"^linux-image-[0-9].*-amd64$"])
    newest: dict[tuple[int, ...], str] = {}
    named = []
    for line in listing.splitlines():
        match = IMAGE.match(line.split(" - ")[0].strip())
        if match:
            release = match[1] + "-amd64"
            series = version_key(release)[:2]
            if series not in newest or version_key(release) > version_key(newest[series]):
                newest[series] = release
            if release in exact:
                named.append(release)
    found = {newest[s] for s in newest} | set(named)
    return sorted(found, key=version_key)


def vmlinuz(root: Path, release: str) -> Path:
    """The kernel image: /boot's (Debian 12's packages), else the modules directory's
    (Debian 13's linux-binary-R)."""
    boot = root / "boot" / f"vmlinuz-{release}"
    return boot if boot.exists() else root / "usr/lib/modules" / release / "vmlinuz"


def unpack(work: Path, release: str) -> Path:
    """The kernel image, its modules and both halves of its headers under WORK/root-R."""
    root = work / f"root-{release}"
    if vmlinuz(root, release).exists() and (root / "usr/src").is_dir():
        return root
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    headers = f"linux-headers-{release}"
    depends = sh(["apt-cache", *APT, "depends", headers])
    extra = sorted(set(re.findall(r"Depends: (linux-(?:headers-\S+-common|kbuild-\S+))",
                                  depends)))
    # Debian 13's newer kernels split the image: vmlinuz in linux-binary-R, the modules
    # in linux-modules-R (linux-image-R only depends on them)
    image = sh(["apt-cache", *APT, "depends", f"linux-image-{release}"])
    extra += sorted(set(re.findall(rf"Depends: (linux-(?:binary|modules)-{re.escape(release)})\b",
                                   image)))
    sh(["apt-get", "download", "-qq", *APT, f"linux-image-{release}", headers, *extra],
       cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        name = deb.name.split("_")[0]
        if name in (f"linux-image-{release}", headers, *extra):
            sh(["dpkg-deb", "-x", str(deb), str(root)])
    return root


def fixtures(out: Path) -> Path:
    """The smoke set's programs, built on the host (the guest's root is read-only)."""
    from conftest import Build
    build = Build(out / "build")
    fx = out / "fixtures"
    fx.mkdir(parents=True, exist_ok=True)
    made = {"perflike-O2fp": build.perflike("O2fp"), "librefcnt.so": build.stub_lib("O2"),
            "perflike-lib": build.perflike("O2", shared_stubs=True),
            "widgetmain": build.usdt_program("-O2")[0]}
    sys.path.insert(0, str(ROOT / "tests" / "bpf"))
    from test_callsites import build_fixture
    cs = out / "build" / "callsites"
    cs.mkdir(parents=True, exist_ok=True)
    made["csmain"], made["csplugin_dlsym.so"] = build_fixture(build, cs, "csplugin_dlsym.c")
    from catalog import build as build_catalog
    made["glibtypes"] = build_catalog(out / "build", "glibtypes.c", ["gobject-2.0"])
    for name, path in made.items():
        link = fx / name
        link.unlink(missing_ok=True)
        link.symlink_to(path)
    subprocess.run(["make", "-C", str(ROOT / "examples")], check=True, capture_output=True)
    return fx


def premerge(work: Path, root: Path, release: str, cache: Path) -> float:
    """Merge the kernel's two header halves into the guest's refcntd cache, on the host,
    with refcntd's own code (kheaders.choose_headers): the guest finds the tree ready.
    Made there, the ~16 000 symlinks take 30 min and more on 9p under TCG.  The halves
    are named by the paths the guest resolves: /usr/src/NAME where this machine has it,
    else the unpacked copy the boot links there.  Seconds it took."""
    sys.path.insert(0, str(ROOT))
    from refcntd.kernel.kheaders import choose_headers
    view = work / f"usrsrc-{release}"  # the guest's /usr/src, as far as headers go
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir()
    for half in (root / "usr/src").iterdir():
        host = Path("/usr/src") / half.name
        (view / half.name).symlink_to(host if host.exists() else half)
    t0 = time.monotonic()
    os.environ.pop("BCC_KERNEL_SOURCE", None)
    tree = choose_headers(view, view / "no-modules", release, cache).path
    took = time.monotonic() - t0
    print(f"kernels: {release}: header tree {tree} ready on the host in {took:.1f} s",
          flush=True)
    return took


def boot(vng: Path, work: Path, release: str, out: Path, fx: Path, cases: list[str]) -> float:
    """One boot that runs the guest driver; the seconds it took in all."""
    root = unpack(work, release)
    cache = work / f"cache-{release}"
    cache.mkdir(mode=0o700, exist_ok=True)
    merged = premerge(work, root, release, cache)
    (out / "premerge.json").write_text(json.dumps({"seconds": round(merged, 1)}))
    guest = " && ".join([
        "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing",
        # virtme lays writable overlays on /usr and /var: a file there has another
        # st_dev than the kernel's mapping of it, so refcntd matches no symbols and no
        # unwind table (frames `?? file dev 0x2b`, libc frames cut).  The 9p tree
        # itself, bound back over the libraries and the fixtures, is the host's.
        "mkdir -p /run/hostroot && mount --bind / /run/hostroot",
        *(f"mount --bind /run/hostroot{d} {d}" for d in (LIBS, fx.parent / "build")),
        f"for d in {root}/usr/src/*; do [ -e /usr/src/${{d##*/}} ] || ln -s $d /usr/src/; done",
        f"cd {ROOT}",
        shlex.join([str(ROOT / ".venv/bin/python"), str(HERE / "kernels_guest.py"), str(out),
                    str(fx), *cases])])
    cmd = [str(vng), "--run", str(vmlinuz(root, release)), "--disable-kvm",
           "--force-9p", "--memory", "4G", "--cpus", "2", "--rwdir", str(out),
           "--rwdir", f"/var/cache/refcntd={cache}", "--exec", guest]
    t0 = time.monotonic()
    with (out / "console.log").open("w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=4 * 3600,
                       check=False, env={"PATH": f"{vng.parent}:/usr/sbin:/usr/bin:/sbin:/bin",
                                         "HOME": "/root"})
    total = time.monotonic() - t0
    (out / "total.json").write_text(json.dumps({"seconds": round(total, 1)}))
    return total


def on_host(out: Path, fx: Path, cases: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run([str(ROOT / ".venv/bin/python"), str(HERE / "kernels_guest.py"), str(out),
                    str(fx), *cases], cwd=ROOT, check=False, capture_output=True)
    return time.monotonic() - t0


def table(rows: list[tuple[str, str, float, dict]], cases: list[str]) -> str:
    """Markdown: one row per kernel, one column per case (✓/✗ and seconds)."""
    head = "| kernel | where | total s | " + " | ".join(cases) + " |"
    lines = [head, "|" + "---|" * (3 + len(cases))]
    for release, where, total, result in rows:
        cells = []
        for case in cases:
            got = result.get("cases", {}).get(case)
            cells.append("–" if got is None else
                         f"{'ok' if got['ok'] else '**FAIL**'} {got['seconds']:.0f} s")
        lines.append(f"| {release} | {where} | {total:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    for release, _, _, result in rows:
        for case, got in result.get("cases", {}).items():
            lines.append(f"* {release}, {case}: {got['detail']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", default=[],
                        help="a release, or a series prefix (6.1); default: each series")
    parser.add_argument("--case", action="append", default=[], help="default: all")
    parser.add_argument("--suite", action="append", default=[],
                        help="a Debian suite whose kernels are offered too (trixie-backports, "
                             "sid), read into a private apt state under --work")
    parser.add_argument("--no-host", action="store_true", help="skip the host's own kernel")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--results", type=Path, default=HERE / "results" / "kernels.md")
    parser.add_argument("--table", action="store_true",
                        help="only write the results page from the runs kept in WORK/runs")
    args = parser.parse_args()
    if args.table:
        return write_table(args.work / "runs", args.results)
    sys.path.insert(0, str(HERE))
    from kernels_guest import CASES
    cases = args.case or list(CASES)
    args.work.mkdir(parents=True, exist_ok=True)
    vng = install_tools(args.work)
    apt_suites(args.work, args.suite)
    available = debian_kernels(tuple(args.kernel))
    wanted = [k for k in available if not args.kernel or any(
        k == w or k.startswith(w + ".") or k.startswith(w + "-") for w in args.kernel)]
    rows = []
    runs = args.work / "runs"
    fx = fixtures(runs)
    if not args.no_host:
        out = fresh(runs / "host")
        rows.append(("host " + os.uname().release, "host",
                     on_host(out, fx, cases), load(out)))
    for release in wanted:
        out = fresh(runs / release)
        total = boot(vng, args.work, release, out, fx, cases)
        rows.append((release, "QEMU TCG, 2 vCPU", total, load(out)))
        print(f"kernels: {release}: {total:.0f} s", flush=True)
    text = table(rows, cases)
    print(text)
    if not args.case and not args.kernel:
        args.results.write_text(HEADER + text)
    outcomes = [r[3].get("cases", {}).get(case, {"ok": False}) for r in rows for case in cases]
    passed = sum(1 for o in outcomes if o["ok"])
    print(f"kernels: {passed} passed, {len(outcomes) - passed} failed")  # CI reads this line
    return 0 if passed == len(outcomes) else 1


def write_table(runs: Path, results: Path) -> int:
    """The results page from each kernel's kept run (several invocations, one page)."""
    sys.path.insert(0, str(HERE))
    from kernels_guest import CASES
    rows = []
    for out in sorted(runs.iterdir(), key=lambda p: (p.name != "host", version_key(p.name))):
        result = load(out)
        if not result:
            continue
        total = seconds(out / "total.json") if (out / "total.json").exists() else \
            sum(c["seconds"] for c in result["cases"].values())
        where = "host" if out.name == "host" else "QEMU TCG, 2 vCPU"
        rows.append((result["kernel"], where, total, result))
    same = [f"* {out.name}: {name}: {verdict}" for out in sorted(runs.iterdir())
            if out.name not in ("host", "build", "fixtures")
            for name, verdict in same_as_host(runs / "host", out).items()]
    merged = [f"* {out.name}: {seconds(out / 'premerge.json'):.1f} s"
              for out in sorted(runs.iterdir()) if (out / "premerge.json").exists()]
    results.write_text(HEADER + table(rows, list(CASES)) + SAME + "\n".join(same) + "\n" +
                       PREMERGE + "\n".join(merged) + "\n")
    return 0


PREMERGE = """
The merged header tree, made on the host before the boot (kernels.py's premerge, with
refcntd's own kheaders; 0.0 s: the tree in WORK/cache-RELEASE was already ready):

"""


def seconds(path: Path) -> float:
    return float(json.loads(path.read_text())["seconds"])


SAME = """
Compared with the host's run (each leaked object's type, final count and allocation
stack as function names, frame by frame, from each case's JSON report):

"""


def same_as_host(host: Path, out: Path) -> dict[str, str]:
    """Per case with a report on both sides: identical, or the first difference."""
    verdicts = {}
    for name in ("demo", "history", "ci", "usdt"):
        theirs, ours = host / f"{name}.json", out / f"{name}.json"
        if theirs.exists() and ours.exists():
            a, b = findings(theirs), findings(ours)
            pairs = zip(a, b, strict=False)
            first = next((f"{x} vs {y}" for x, y in pairs if x != y), f"{len(a)} vs {len(b)}")
            verdicts[name] = (f"identical ({len(a)} objects)" if a == b else
                              f"DIFFERENT: {first}")
    return verdicts


def findings(path: Path) -> list[tuple]:
    report = json.loads(path.read_text())
    return sorted((g["type"], i["count"], tuple(f.get("function") or "?" for f in g["stack"]))
                  for p in report["processes"] for g in p["groups"] for i in g["instances"])


def fresh(out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def load(out: Path) -> dict:
    path = out / "result.json"
    return json.loads(path.read_text()) if path.exists() else {}


HEADER = """# Kernel matrix (benchmarks/kernels.py)

Debian's own kernels booted with virtme-ng under QEMU TCG (no KVM on this machine),
over the host's root file system; the same smoke set on the host's kernel first.
Seconds are wall time of each case (TCG is 30-60x slower than the host); `total` is
the whole boot, or the whole host pass.  The first run on a kernel compiles the BPF
program (prebuild); later runs load it from WORK/cache-RELEASE.

Measured 2026-11-28 on the project's 2-vCPU VM (Linux 6.18, no KVM), at branch k612
(main 1c5496a + the header pre-merge), while other sessions worked beside it: load
average 2.6-9.5 during the 6.12 boot (06:50-07:09), 4.5-8 during the 6.1 boot
(07:14-07:27).  Both boots compiled cold (`prebuild`: 6.12 175 s of compile, 225 s in
all; 6.1 187 s, 246 s), with the merged header tree made on the host before the boot
by kernels.py (refcntd's own kheaders): the guest found it ready and merged nothing.
From empty, that merge took 17 s (6.12, 16 712 files) and 2.6 s (6.1, 15 916) on the
host at load ~5.  Before, the guest made it on the 9p cache directory: 6.1's cold
prebuild took 1442 s (18 min of merging, then 4 of compile, load ~9), and 6.12's did
not finish in 30 min (8 436 links made).  The whole 6.12 boot, cold, now takes 1093 s.
The 6.12 tree of this run was made at 06:50 by the same premerge in 5.8 s, removing
the guest's interrupted merge first (refcntd rebuilds a tree without its stamp
instead of trusting it).

A rig effect, fixed in the script: virtme-ng lays writable overlays on /usr and
/var, and a file seen through one has another st_dev than the kernel's mapping of
it, so refcntd matched neither symbols nor unwind tables there (frames `?? file dev
0x2b inode N`; libc frames cut).  The first 6.1 pass, before the fix, had the same
counts but those frames; the script now binds the 9p tree back over the libraries
and the fixtures.

"""


if __name__ == "__main__":
    sys.exit(main())
