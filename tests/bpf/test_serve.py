"""refcntd serve: real daemon, real processes, real HTTP scrapes."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import FIXTURES, REFCNTD, ROOT, leak_summary
from prometheus_client.parser import text_string_to_metric_families
from test_callsites import GETS_PUTS as CALLSITE_GETS_PUTS
from test_callsites import TRUTH as CALLSITE_TRUTH
from test_callsites import build_fixture as callsite_fixture
from test_run import PERFLIKE_LEAKS, assert_perflike_truth
from test_usdt import Holder, all_zero, semaphores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """A running `refcntd serve`; stopped (SIGKILL if need be) even when a test fails."""

    def __init__(self, tmp: Path, targets: str, env: dict[str, str] | None = None,
                 web: str = "web:\n  enable_checkpoint: true\n",
                 wrap: tuple[str, ...] = ()) -> None:
        """`wrap`: a command that execs its arguments (a mount namespace of its own)."""
        self.port, self.web = free_port(), web
        self.config = tmp / "refcntd.yaml"
        self.reports = tmp / "reports"
        self.write_config(targets)
        self.proc = subprocess.Popen([*wrap, *REFCNTD, "serve", "--config", str(self.config)],
                                     cwd=ROOT, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})})
        self.log = ""
        try:
            self.wait_log("serving", 120)
        except BaseException:  # __exit__ will not run: never leave a daemon behind
            self.__exit__()
            raise

    def write_config(self, targets: str) -> None:
        self.config.write_text(f"version: 1\nlisten: 127.0.0.1:{self.port}\n{self.web}"
                               f"report_dir: {self.reports}\ntargets:\n{targets}")

    def wait_log(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stderr.fileno()  # raw reads: a text buffer would hide lines from select
        while needle not in self.log and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                chunk = os.read(fd, 65536)
                self.log += chunk.decode(errors="replace")
                if not chunk:
                    break
            elif self.proc.poll() is not None:
                break
        assert needle in self.log, self.log

    def scrape(self) -> dict[tuple, float]:
        """Every sample as {(name, sorted labels): value}, parsed by prometheus_client."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            text = r.read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def leaks(self, timeout: float = 60) -> dict:
        """GET /leaks: every target's live processes scanned, as JSON."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/leaks",
                                    timeout=timeout) as r:
            return json.loads(r.read())

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=60)
        self.log += err.decode(errors="replace")
        return self.proc.returncode

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def metric(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def target_yaml(name: str, path: Path, spec: str = "perf-stubs", extra: str = "") -> str:
    return f"  - name: {name}\n    path: {path}\n    spec: {spec}\n{extra}"


def probe_points(binary: Path) -> int:
    """Uprobes the daemon installs for the default spec (call sites count one each)."""
    from refcntd.binary.plan import build_plan
    from refcntd.inputs.spec import load_spec
    plan = build_plan(load_spec("perf-stubs"), str(binary))
    assert {d.mode for d in plan.decisions} == {"callsites"}
    return len(plan.sites)


def test_serve_metrics_reports_and_sigterm(bpf, build, tmp_path):
    perflike = build.perflike("O2fp")
    exe, lib = build.usdt_program("-O2", shared=True)
    targets = (target_yaml("perflike", perflike) + target_yaml("widgets", lib, "example-usdt")
               + target_yaml("missing", tmp_path / "no-such-binary"))
    holder = None
    with Serve(tmp_path, targets) as serve:
        assert "target=missing" in serve.log and "cannot attach" in serve.log
        runs = [subprocess.Popen([str(perflike), "30"], stdout=subprocess.DEVNULL)
                for _ in range(3)]  # several at once, each lives a few ms
        assert [p.wait(timeout=60) for p in runs] == [0, 0, 0]
        runs.append(subprocess.Popen([str(perflike)], stdout=subprocess.DEVNULL))
        assert runs[-1].wait(timeout=60) == 0
        holder = Holder(exe)
        assert holder.work() == 8
        for run in runs:  # every exit reported before the scrape
            serve.wait_log(f"target=perflike pid={run.pid} ", 30)
        time.sleep(0.5)
        m = serve.scrape()
        stopped = serve.stop()
    try:
        assert stopped == 0, serve.log
        assert all_zero(semaphores(holder.proc.pid, lib))  # restored after SIGTERM
    finally:
        holder.kill()

    # perflike: 4 exited runs, each with the documented leaks
    for type_name, counts in PERFLIKE_LEAKS.items():
        assert metric(m, "refcntd_leaked_objects_total", target="perflike",
                      type=type_name) == 4 * len(counts)
    assert metric(m, "refcntd_processes_reported_total", target="perflike") == 4
    assert metric(m, "refcntd_operations_total", target="perflike", type="comm",
                  operation="init") == 3 * 30 + 100
    assert metric(m, "refcntd_operations_total", target="perflike", type="comm",
                  operation="release") == 3 * 30 + 100
    # widgets: the holder is still running with 2 live objects (counts 2 and 1)
    assert metric(m, "refcntd_live_objects", target="widgets", type="widget") == 2
    assert metric(m, "refcntd_traced_processes", target="widgets", binary=str(lib)) == 1
    assert metric(m, "refcntd_operations_total", target="widgets", type="widget",
                  operation="get") == 2
    assert metric(m, "refcntd_live_object_age_seconds_count", target="widgets",
                  type="widget") == 2
    # probes and the target that could not be attached
    # a uprobe per call site of each -O2 stub (auto picks call sites): 4 functions, 15 sites
    assert metric(m, "refcntd_probes", target="perflike", state="attached") == \
        probe_points(perflike)
    assert metric(m, "refcntd_probes", target="widgets", state="attached") == 4
    assert metric(m, "refcntd_target_attach_errors", target="missing") == 1
    assert metric(m, "refcntd_dropped_records_total", target="perflike",
                  reason="obj_map_full") == 0
    assert metric(m, "refcntd_reports_written_total") == 4
    assert metric(m, "process_resident_memory_bytes") > 0  # refcntd's own
    for (name, labels), _ in m.items():
        assert name.startswith(("refcntd_", "process_", "python_")), name
        assert not {"pid", "address", "stack"} & {k for k, _ in labels}

    # report files: a pair per exited process, and the holder's live-at-detach report
    # written at SIGTERM; time-sortable names, private modes
    reports = sorted(serve.reports.glob("*.json"))
    assert len(reports) == 5 and len(list(serve.reports.glob("*.txt"))) == 5
    mtimes = [p.stat().st_mtime for p in reports]
    assert mtimes == sorted(mtimes)
    assert stat.S_IMODE(serve.reports.stat().st_mode) == 0o750
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o640 for p in reports)
    by_state: dict[str, list[dict]] = {}
    for path in reports:
        data = json.loads(path.read_text())
        assert data["schema"] == "refcntd-report" and data["mode"] == "serve"
        (process,) = data["processes"]
        by_state.setdefault(process["state"], []).append(process)
    (live,) = by_state["live at detach"]
    assert live["pid"] == holder.proc.pid and leak_summary(live) == {"widget": [1, 2]}
    exited = by_state["exited"]
    assert len(exited) == 4
    for process in exited:
        if process["command"] == [str(perflike)]:
            assert_perflike_truth(process)
        else:  # 30 samples: 3 kernel samples leak 3 references on the kernel map
            assert leak_summary(process) == dict(PERFLIKE_LEAKS, map=[1, 1, 1, 3])


def test_landing_page(bpf, build, tmp_path):
    with Serve(tmp_path, target_yaml("perflike", build.perflike("O2"))) as serve:
        with urllib.request.urlopen(f"http://127.0.0.1:{serve.port}/", timeout=10) as r:
            assert b'<a href="/metrics">' in r.read()
        assert serve.stop() == 0


def test_sighup_adds_and_removes_targets_and_keeps_counts(bpf, build, tmp_path):
    perflike = build.perflike("O2fp")
    exe, lib = build.usdt_program("-O2", shared=True)
    widgets = target_yaml("widgets", lib, "example-usdt")
    holder = None
    with Serve(tmp_path, widgets + target_yaml("perflike", perflike)) as serve:
        holder = Holder(exe)
        holder.work()
        time.sleep(0.5)
        before = serve.scrape()
        masami = build.program("masami", [FIXTURES / "masami.c"])
        serve.write_config(widgets + target_yaml("masami", masami))
        serve.proc.send_signal(signal.SIGHUP)
        serve.wait_log("reloaded")
        subprocess.run([str(masami)], check=True)
        serve.wait_log("target=masami pid=")
        after = serve.scrape()
        serve.stop()
    holder.kill()
    key = {"target": "widgets", "type": "widget"}
    assert metric(before, "refcntd_live_objects", **key) == 2
    assert metric(after, "refcntd_live_objects", **key) == 2  # not reset by the reload
    assert metric(after, "refcntd_operations_total", operation="get", **key) == \
        metric(before, "refcntd_operations_total", operation="get", **key) == 2
    assert metric(before, "refcntd_probes", target="perflike", state="attached") == \
        probe_points(perflike)
    assert metric(after, "refcntd_probes", target="perflike", state="attached") is None
    assert metric(after, "refcntd_leaked_objects_total", target="masami", type="o") == 2
    assert "target=perflike detached" in serve.log


def test_serve_strict_fails_on_a_target_it_cannot_attach(bpf, tmp_path):
    port = free_port()
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\nlisten: 127.0.0.1:{port}\nreport_dir: {tmp_path}/r\n"
                      f"targets:\n" + target_yaml("missing", tmp_path / "nope"))
    proc = subprocess.run([*REFCNTD, "serve", "--strict", "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("refcntd: ")
    assert "Traceback" not in proc.stderr


def test_unwritable_report_dir_is_logged_counted_and_survived(bpf, build, tmp_path):
    perflike = build.perflike("O2")
    with Serve(tmp_path, target_yaml("perflike", perflike)) as serve:
        # root ignores permission bits: a file where the directory should be blocks writes
        serve.reports.write_text("not a directory")
        subprocess.run([str(perflike)], check=True, capture_output=True)
        serve.wait_log("report not written")
        subprocess.run([str(perflike)], check=True, capture_output=True)
        time.sleep(1)
        m = serve.scrape()  # still serving
        assert serve.stop() == 0
    assert metric(m, "refcntd_report_errors_total") == 2
    assert metric(m, "refcntd_leaked_objects_total", target="perflike", type="map") == 8




def run_waiter_once_attached(serve, exe):
    """Start the waiter fixture at `exe`, wait until serve attached it (at its exec,
    before any object), let it finish, wait for its report; (process, final scrape)."""
    proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    serve.wait_log(f"binary={exe} attached")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0
    serve.wait_log(f"target=apps pid={proc.pid} ")
    m = serve.scrape()
    assert serve.stop() == 0
    return proc, m


def test_new_binary_matching_a_glob_is_attached_at_exec(bpf, build, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(build.perflike("O2"), bindir / "first")
    with Serve(tmp_path, target_yaml("apps", f"{bindir}/*")) as serve:
        assert f"binary={bindir}/first attached" in serve.log
        late = bindir / "second"
        shutil.copy(build.program("waiter", [FIXTURES / "waiter.c"],
                                  "O2"), late)
        proc, m = run_waiter_once_attached(serve, late)
    assert metric(m, "refcntd_leaked_objects_total", target="apps", type="session") == 1
    # noticed at its exec, or by the path watcher just before it
    assert f"new binary {late} (pid {proc.pid})" in serve.log or \
        f"binary={late} appeared" in serve.log


def test_a_binary_seen_half_copied_is_attached_once_complete(bpf, build, tmp_path):
    """Deploying by copy: the watcher can see the file before its last byte is written
    ("not an ELF file"); once it is complete, its first exec attaches it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(build.perflike("O2"), bindir / "first")
    full = build.program("waiter", [FIXTURES / "waiter.c"], "O2").read_bytes()
    late = bindir / "second"
    with Serve(tmp_path, target_yaml("apps", f"{bindir}/*")) as serve:
        late.write_bytes(full[:40])  # an ELF header cut short
        serve.wait_log(f"binary={late} cannot attach")
        late.write_bytes(full)
        late.chmod(0o755)
        _, m = run_waiter_once_attached(serve, late)
    assert metric(m, "refcntd_leaked_objects_total", target="apps", type="session") == 1


def test_serve_probes_exported_stubs_at_call_sites_in_plugins(bpf, build, tmp_path):
    """System-wide: -O2 stubs exported by the traced program, called through the PLT of
    a library and of a plugin dlopen'ed by each run; the plugin is scanned while the
    first run waits in its dlopen.  Every run's report is exact."""
    exe, plugin = callsite_fixture(build, tmp_path)
    with Serve(tmp_path, target_yaml("csmain", exe)) as serve:
        runs = []
        for _ in range(2):
            runs.append(subprocess.Popen([str(exe), str(plugin)], stdout=subprocess.DEVNULL))
            assert runs[-1].wait(timeout=60) == 0
        for run in runs:
            serve.wait_log(f"target=csmain pid={run.pid} ", 30)
        time.sleep(0.5)
        m = serve.scrape()
        assert serve.stop() == 0, serve.log
    reports = [json.loads(p.read_text()) for p in sorted(serve.reports.glob("*.json"))]
    processes = [p for r in reports for p in r["processes"]]
    assert len(processes) == 2
    for process in processes:
        assert leak_summary(process) == CALLSITE_TRUTH
        assert sorted((i["gets"], i["puts"]) for g in process["groups"]
                      for i in g["instances"]) == CALLSITE_GETS_PUTS
    # the plan's 7 probes in csmain and libcsuser.so, and the plugin's get, added once,
    # at the first run's dlopen
    assert metric(m, "refcntd_probes", target="csmain", state="attached") == 8
