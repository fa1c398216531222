"""The soak's rig (benchmarks/soak.py): the workload's binaries, `refcntd serve` as a
real subprocess with its config, and a real Prometheus (Debian's) scraping it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent
GEN = ROOT / "benchmarks" / "soakgen.c"
STUBS = ROOT / "examples" / "refcnt.c"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gcc(out: Path, sources: list[Path], flags: list[str]) -> Path:
    """Compiled to a temporary name and renamed over `out`: a package upgrade's new
    inode, never a half-written file under the watched path."""
    tmp = out.with_name(out.name + ".new")
    subprocess.run(["gcc", "-g", "-Wall", "-Werror", f"-I{ROOT / 'examples'}", "-o", str(tmp),
                    *map(str, sources), *flags], check=True)
    os.rename(tmp, out)
    return out


@dataclass
class Binaries:
    """The targets' files: `gen` (stubs linked in, -O2 without frame pointers: call
    sites), `lib` (the stubs as librefcnt.so, called by `genlib`), `svc` and `extra`
    (copies of gen's first build, under their own targets)."""

    dir: Path
    build: int = 0
    gen: Path = field(init=False)
    genlib: Path = field(init=False)
    lib: Path = field(init=False)
    svc: Path = field(init=False)
    extra: Path = field(init=False)

    def __post_init__(self) -> None:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        self.gen, self.genlib, self.lib = d / "soakgen", d / "soakgen-lib", d / "librefcnt.so"
        self.svc, self.extra = d / "soaksvc", d / "soakextra"
        self.upgrade()
        gcc(self.lib, [STUBS], ["-O2", "-fPIC", "-shared"])
        gcc(self.genlib, [GEN], ["-O2", "-fno-omit-frame-pointer", f"-L{d}", "-lrefcnt",
                                 f"-Wl,-rpath,{d}"])
        for copy in (self.svc, self.extra):
            shutil.copy(self.gen, copy)

    def upgrade(self) -> None:
        """A new build of `gen` (a new build-id) renamed over the old one."""
        self.build += 1
        gcc(self.gen, [GEN, STUBS], ["-O2", "-fomit-frame-pointer",
                                     f"-DSOAK_BUILD={self.build}"])


def build_id(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if "Build ID" in line), "")


class Http:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, timeout: float = 30) -> tuple[float, bytes]:
        """(seconds, body) of a GET."""
        start = time.perf_counter()
        with urllib.request.urlopen(self.base + path, timeout=timeout) as r:
            body = r.read()
        return time.perf_counter() - start, body

    def post(self, path: str) -> bytes:
        req = urllib.request.Request(self.base + path, data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return bytes(r.read())

    def json(self, path: str) -> dict:
        return dict(json.loads(self.get(path)[1]))


class ServeProcess:
    """`refcntd serve` with the targets of `targets_yaml()` (a subclass's), GET /leaks
    and /checkpoint on; its log in work/serve.log.  Waits are long: on this shared
    2-core machine an attach under load has taken over a minute."""

    def __init__(self, work: Path, max_reports: int, source: Path = ROOT) -> None:
        """`source`: the tree whose refcntd serves (another checkout: benchmarks/gstflag.py
        runs main's beside this one's, through this venv with its PYTHONPATH)."""
        self.work, self.max_reports = work, max_reports
        self.port = free_port()
        self.http = Http(self.port)
        self.config = work / "refcntd.yaml"
        self.reports = work / "reports"
        self._write_config()
        self.log = open(work / "serve.log", "ab")  # noqa: SIM115 - closed in stop()
        env = None if source == ROOT else {**os.environ, "PYTHONPATH": str(source)}
        self.proc = subprocess.Popen([str(ROOT / ".venv/bin/refcntd"), "serve", "--config",
                                      str(self.config)], cwd=source, stderr=self.log, env=env)
        self._wait(lambda: self._ready(), 180, "serve did not become ready")

    def targets_yaml(self) -> str:
        raise NotImplementedError

    def _write_config(self) -> None:
        self.config.write_text(
            f"version: 1\nlisten: 127.0.0.1:{self.port}\nweb:\n  enable_checkpoint: true\n"
            f"report_dir: {self.reports}\nretention:\n  max_reports: {self.max_reports}\n"
            "targets:\n" + self.targets_yaml())

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"serve exited {self.proc.returncode}: see {self.log.name}")
        try:
            self.http.get("/metrics", 5)
            return True
        except OSError:
            return False

    @staticmethod
    def _wait(ok: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not _answered(ok):
            if time.monotonic() > deadline:
                raise RuntimeError(what)
            time.sleep(0.2)

    def status(self) -> dict:
        return self.http.json("/status")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code


class Serve(ServeProcess):
    """The soak's serve: targets gen, genlib (its library), svc and, while `extra` is
    on, extra."""

    def __init__(self, work: Path, bins: Binaries, max_reports: int) -> None:
        self.bins, self.extra = bins, False
        super().__init__(work, max_reports)

    def targets_yaml(self) -> str:
        b = self.bins
        targets = [("gen", b.gen, ""), ("genlib", b.lib, "    history: true\n"),
                   ("svc", b.svc, "")] + ([("extra", b.extra, "")] if self.extra else [])
        return "".join(f"  - name: {n}\n    path: {p}\n    spec: perf-stubs\n{x}"
                       for n, p, x in targets)

    def set_extra(self, on: bool) -> float:
        """Add or remove the `extra` target by a config reload (SIGHUP); seconds until
        /status shows it done."""
        start = time.monotonic()
        self.extra = on
        self._write_config()
        self.proc.send_signal(signal.SIGHUP)
        self._wait(lambda: self._ready() and
                   (("extra" in self.status()["targets"]) == on), 300, "reload not applied")
        return time.monotonic() - start

    def attached_build_ids(self, target: str) -> set[str]:
        attached = self.status()["targets"].get(target, {}).get("attached", {})
        return {bid for a in attached.values() for bid in a["build_ids"].values()}

    def wait_build(self, target: str, bid: str) -> float:
        start = time.monotonic()
        self._wait(lambda: bid in self.attached_build_ids(target), 300,
                   f"{target} never attached build-id {bid}")
        return time.monotonic() - start


def _answered(ok: object) -> bool:
    """ok(), an HTTP request that timed out (a busy daemon) being a no."""
    try:
        return bool(ok())  # type: ignore[operator]
    except OSError:  # TimeoutError and URLError included
        return False


class Prometheus:
    """Debian's Prometheus scraping serve's /metrics every `every_s` seconds."""

    def __init__(self, work: Path, target_port: int, every_s: int = 5) -> None:
        self.port = free_port()
        config = work / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {every_s}s, scrape_timeout: {every_s - 1}s}}\n"
            "scrape_configs:\n  - job_name: refcntd\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]\n")
        self.log = open(work / "prometheus.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=self.log)
        self.http = Http(self.port)

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector (empty while Prometheus is starting)."""
        from urllib.parse import quote
        try:
            data = self.http.json(f"/api/v1/query?query={quote(expr)}")
        except OSError:
            return []
        return list(data["data"]["result"])

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Soaking(Protocol):
    rows: list[dict]

    def run(self) -> None: ...

    def finish(self) -> dict: ...


def run_soak(work: Path | None, prefix: str,
             start: Callable[[Path], Soaking]) -> tuple[list[dict], dict]:
    """(rows, end) of a soak started in `work` (a temporary folder without one), stopped
    and finished even when interrupted; its raw.json kept there for --from-raw."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = work or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        soak = start(folder)
        try:
            soak.run()
        finally:
            end = soak.finish()
        (folder / "raw.json").write_text(json.dumps({"rows": soak.rows, "end": end}))
    return soak.rows, end
