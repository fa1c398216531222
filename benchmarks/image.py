"""The container commands the docs give, run as written against the OCI image.

Takes the commands from the docs' code blocks (never retyped here): from
docs/install.md's "The OCI image", the CI-job form (`podman run ... refcntd run
... -- ./run-tests`), the serve form (`podman run -d ... refcntd serve`) and its
`refcntd.yaml`; from docs/ci.md's "A GitLab CI job", the job's `podman build` and
`podman run` lines.  Each runs through bash, as a user pastes it, with only the
changes `adapt` makes, each a parameter: this machine's extra podman options
(--run-flag, --build-flag), the image's tag, the container's name, the host
directory of /etc/refcntd.  A unit test (tests/unit/test_image_commands.py) checks
that `adapt` with the documented values gives the documented text back.

On a real test program (examples/perflike, 8 leaked objects of 3 types per run):
* the GitLab job's build makes the image from this checkout;
* the CI-job form and the GitLab job's run audit `./run-tests` (which runs
  perflike) in a work directory mounted at /src: exit 23 and, in leaks.json, the
  leak groups (type, kind, counts, frames outside libc) of a run of the same
  program by refcntd on the host;
* the serve form traces perflike on the host through /proc/PID/root/... (the
  program's directory is not mounted into the container): 3 runs started on the
  host, /metrics counts 3 times a host run's leaks, /debug/pprof/refcount answers;
  the probed offsets hold int3 in a fresh mapping of the file while it serves,
  and none after `podman kill -s KILL`.
Writes benchmarks/results/image.md and .json.  As root, from a clone:

    python benchmarks/image.py --build-flag=--build-arg=BASE=localhost/debian-debootstrap:trixie
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run import machine  # noqa: E402

INSTALL, CI = ROOT / "docs/install.md", ROOT / "docs/ci.md"
DOC_TAG, DOC_NAME, DOC_CONF = "refcntd", "refcntd", "/etc/refcntd"
DOC_TARGET = "/proc/1/root/usr/local/bin/myprog"
RESULTS = HERE / "results"


@dataclass
class Machine:
    """What this machine needs beyond the docs' text (each is empty or the documented
    value in the docs' own setting)."""

    run_flags: list[str] = field(default_factory=list)
    build_flags: list[str] = field(default_factory=list)
    tag: str = DOC_TAG
    name: str = DOC_NAME
    conf: str = DOC_CONF


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## `."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def shell_lines(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line.split("  #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def documented() -> dict[str, str]:
    """The container commands and the serve config the docs give, by name."""
    install = section(INSTALL.read_text(), "The OCI image")
    lines = [c for b in blocks(install, "sh") for c in shell_lines(b)]
    (run_form,) = [c for c in lines if c.startswith("podman run ") and " refcntd run " in c]
    (serve,) = [c for c in lines if c.startswith("podman run ") and " refcntd serve " in c]
    (config,) = blocks(install, "yaml")
    (job,) = yaml.safe_load(blocks(section(CI.read_text(), "A GitLab CI job"), "yaml")[0]
                            ).values()
    (build,) = [c for c in job["script"] if c.startswith("podman build ")]
    (ci_run,) = [c for c in job["script"] if c.startswith("podman run ")]
    return {"install-run": run_form, "install-serve": serve, "install-config": config,
            "gitlab-build": build, "gitlab-run": ci_run}


def adapt(command: str, m: Machine) -> str:
    """`command` as run here: this machine's podman options after `podman run` or
    `podman build`, the image tag, the container's name and the config directory."""
    extra = {"podman run ": m.run_flags, "podman build ": m.build_flags}
    for verb, flags in extra.items():
        if command.startswith(verb) and flags:
            command = verb + shlex.join(flags) + " " + command[len(verb):]
    command = command.replace(f"-t {DOC_TAG} ", f"-t {m.tag} ")
    command = command.replace(f" {DOC_TAG} run ", f" {m.tag} run ")
    command = command.replace(f" {DOC_TAG} serve ", f" {m.tag} serve ")
    command = command.replace(f"--name {DOC_NAME} ", f"--name {m.name} ")
    return command.replace(f"-v {DOC_CONF}:", f"-v {m.conf}:")


def bash(command: str, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def groups(report: dict) -> list[tuple]:
    """Each leak group as (type, kind, counts, frames outside libc): what must match a
    host run."""
    out = []
    for process in report["processes"]:
        for g in process["groups"]:
            frames = tuple(f.get("function", "") for f in g["stack"]
                           if "libc.so" not in f.get("module", ""))
            out.append((g["type"], g.get("kind", ""),
                        tuple(sorted(i["count"] for i in g["instances"])), frames))
    return sorted(out)


def host_run(program: Path, work: Path) -> list[tuple]:
    out = work / "host.json"
    done = subprocess.run([sys.executable, "-m", "refcntd", "run", "--json", str(out), "--",
                           str(program)], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 23:
        raise RuntimeError(f"host run: exit {done.returncode}: {done.stderr[-400:]}")
    return groups(json.loads(out.read_text()))


def audit(name: str, command: str, work: Path, truth: list[tuple]) -> dict:
    """A CI-job form: exit 23 and the host run's groups in leaks.json."""
    (work / "leaks.json").unlink(missing_ok=True)
    started = time.monotonic()
    done = bash(command, work)
    row = {"case": name, "command": command, "exit": done.returncode,
           "seconds": round(time.monotonic() - started, 1)}
    leaks = work / "leaks.json"
    got = groups(json.loads(leaks.read_text())) if leaks.exists() else None
    row["same_groups_as_host"] = got == truth
    row["groups"] = len(got or [])
    row["ok"] = done.returncode == 23 and got == truth
    if name == "gitlab-run":
        junit = work / "refcntd.xml"
        row["junit_failures"] = junit.read_text().count("<failure") if junit.exists() else None
        row["ok"] = row["ok"] and bool(row["junit_failures"])
    if not row["ok"]:
        row["stderr"] = done.stderr[-2000:]
    return row


def probe_bytes(path: Path, offsets: list[int]) -> list[int]:
    """The byte at each offset in a fresh private mapping of the file: uprobes put their
    int3 (0xcc) into every new mapping of a probed file."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                          prot=mmap.PROT_READ | mmap.PROT_EXEC) as mem:
        return [mem[o] for o in offsets]


def probe_offsets(program: Path) -> list[int]:
    sys.path.insert(0, str(ROOT))
    from refcntd.binary.plan import build_plan
    from refcntd.inputs.spec import load_spec
    return sorted({s.file_offset for s in build_plan(load_spec("perf-stubs"),
                                                     str(program)).sites})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def host_root_pid() -> tuple[int, subprocess.Popen[bytes] | None]:
    """PID 1 when its root can be read here (the docs' /proc/1/root), else a process of
    the host's root started for the purpose (this sandbox's PID 1 refuses)."""
    try:
        os.listdir("/proc/1/root/")
        return 1, None
    except OSError:
        keeper = subprocess.Popen(["sleep", "3600"])
        return keeper.pid, keeper


def serve(m: Machine, docs: dict[str, str], program: Path, work: Path,
          truth: list[tuple]) -> dict:
    """The serve form, on `program` named through /proc/PID/root only."""
    pid, keeper = host_root_pid()
    conf = Path(m.conf)
    conf.mkdir(parents=True, exist_ok=True)
    port = free_port()
    target = f"/proc/{pid}/root{program}"
    text = docs["install-config"].replace(DOC_TARGET, target)
    text = text.replace("0.0.0.0:10271", f"127.0.0.1:{port}")
    (conf / "refcntd.yaml").write_text(text)
    command = adapt(docs["install-serve"], m)
    offsets = probe_offsets(program)
    original = probe_bytes(program, offsets)
    row: dict = {"case": "install-serve", "command": command, "target": target,
                 "config": text, "ok": False}
    if keeper is not None:
        row["root"] = ("/proc/1/root cannot be read here (this sandbox's PID 1 refuses): "
                       f"the root of a sleep process (pid {pid}) of the host's root")
    try:
        started = time.monotonic()
        done = bash(command, work, timeout=120)
        row["exit"] = done.returncode
        logs = wait_logs(m.name, "serving", 300)
        row["attach_seconds"] = round(time.monotonic() - started, 1)
        row["attached"] = re.findall(r"attached \(\d+ probes\)", logs)
        row["int3_while_serving"] = probe_bytes(program, offsets).count(0xCC)
        runs = [subprocess.Popen([str(program), "30"], stdout=subprocess.DEVNULL)
                for _ in range(3)]
        row["program_exits"] = [r.wait(timeout=60) for r in runs]
        for r in runs:
            logs = wait_logs(m.name, f"pid={r.pid} ", 60)
        time.sleep(1)
        row["metrics"] = scrape(port)
        row["pprof"] = pprof(port)
    finally:
        bash(f"podman kill -s KILL {m.name}", work)
        bash(f"podman rm -f {m.name}", work)
        if keeper is not None:
            keeper.kill()
            keeper.wait()
    time.sleep(1)
    row["int3_after_kill"] = probe_bytes(program, offsets).count(0xCC)
    row["bytes_restored"] = probe_bytes(program, offsets) == original
    row["probes"] = len(offsets)
    want = {}
    for t, _kind, counts, _frames in truth:
        want[t] = want.get(t, 0) + 3 * len(counts)
    row["expected_leaks"] = want
    row["ok"] = (row["metrics"].get("leaked") == want and row["pprof"][0] == 200
                 and row["int3_while_serving"] == len(offsets)
                 and row["int3_after_kill"] == 0 and row["bytes_restored"]
                 and row["program_exits"] == [0, 0, 0])
    return row


def wait_logs(name: str, needle: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
        logs = done.stdout + done.stderr
        if needle in logs:
            return logs
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {needle!r} in the container's log: {logs[-1500:]}")
        time.sleep(1)


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    leaked = {m[1]: int(float(m[2])) for m in re.finditer(
        r'^refcntd_leaked_objects_total\{target="myprog",type="(\w+)"\} (\S+)', text, re.M)}
    reported = re.search(r'^refcntd_processes_reported_total\{target="myprog"\} (\S+)', text,
                         re.M)
    return {"leaked": leaked, "reported": int(float(reported[1])) if reported else None}


def pprof(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pprof/refcount",
                                timeout=60) as r:
        return r.status, r.headers.get("Content-Type", "")


def write(rows: list[dict], m: Machine, argv: list[str]) -> None:
    info = machine()
    result = {"machine": info, "argv": argv, "adapt": asdict(m), "rows": rows}
    RESULTS.joinpath("image.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# The docs' container commands, run against the image",
             "",
             f"`python benchmarks/image.py {' '.join(argv)}` on {info['date']}, commit "
             f"{info['commit']}, kernel {info['kernel']}, {info['cpus']} CPUs, load "
             f"{info['load']}. The commands are taken from docs/install.md and "
             "docs/ci.md ([the script](../image.py) says how); each ran as shown.", ""]
    for row in rows:
        lines += [f"## {row['case']}: {'ok' if row['ok'] else 'FAILED'}", "",
                  "```sh", row["command"], "```", ""]
        shown = {k: v for k, v in row.items() if k not in ("case", "command", "ok")}
        lines += [f"* {k}: `{json.dumps(v)}`" for k, v in shown.items()] + [""]
    RESULTS.joinpath("image.md").write_text("\n".join(lines))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-flag", action="append", default=[],
                        help="an option this machine's `podman run` needs (repeat)")
    parser.add_argument("--build-flag", action="append", default=[],
                        help="an option this machine's `podman build` needs (repeat)")
    parser.add_argument("--tag", default="localhost/refcntd:doccheck")
    parser.add_argument("--work", type=Path, default=Path("/var/tmp/refcntd-image-check"))
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("image.py: run as root (podman --privileged, BPF)", file=sys.stderr)
        return 2
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    m = Machine(args.run_flag, args.build_flag, args.tag, "refcntd-doccheck",
                str(args.work / "etc-refcntd"))
    docs = documented()
    subprocess.run(["make", "-s", "-C", str(ROOT / "examples")], check=True)
    program = args.work / "bin" / "perflike"  # not under /src: serve sees it only via /proc
    program.parent.mkdir()
    shutil.copy2(ROOT / "examples/build/perflike", program)
    suite = args.work / "src"
    suite.mkdir()
    shutil.copy2(program, suite / "perflike")
    (suite / "run-tests").write_text("#!/bin/sh\n# the test suite: the leaking example\n"
                                     "exec ./perflike\n")
    (suite / "run-tests").chmod(0o755)
    truth = host_run(suite / "perflike", args.work)
    rows = []
    started = time.monotonic()
    built = bash(adapt(docs["gitlab-build"], m), suite, {"REFCNTD_SRC": str(ROOT)})
    rows.append({"case": "gitlab-build", "command": adapt(docs["gitlab-build"], m),
                 "env": {"REFCNTD_SRC": "this checkout"}, "exit": built.returncode,
                 "seconds": round(time.monotonic() - started, 1),
                 "ok": built.returncode == 0, **({} if built.returncode == 0 else
                                                 {"stderr": built.stderr[-2000:]})})
    if built.returncode == 0:
        for name in ("install-run", "gitlab-run"):
            rows.append(audit(name, adapt(docs[name], m), suite, truth))
        rows.append(serve(m, docs, program, args.work, truth))
    rows.insert(0, {"case": "host", "command": f"refcntd run --json host.json -- "
                    f"{suite / 'perflike'}", "groups": len(truth), "ok": True})
    write(rows, m, argv)
    for row in rows:
        print(f"{row['case']}: {'ok' if row['ok'] else 'FAILED'}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
