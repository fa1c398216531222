"""A probe the kernel refuses is reported as not installed, for the binary it was
refused in: typed failures (site index, stage, errno), never matched as text."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

from conftest import refcntd
from test_serve import Serve, target_yaml

from refcntd.binary.plan import build_plan
from refcntd.inputs.spec import load_spec

# Entry probes: these tests provoke failures at the functions' entries.
ENTRY = {"*": "entry"}


def conflicting_uprobe(binary: Path, role: str) -> tuple[int, str]:
    """Hold a uprobe on a planned site with another USDT semaphore offset: the kernel
    then refuses refcntd's probe there (EINVAL). Returns (fd, refused function)."""
    from refcntd.kernel import perf_uprobe
    (site,) = [s for s in build_plan(load_spec("perf-stubs"), str(binary), ENTRY).sites
               if s.role == role]
    # offset 2 lies in the read-only ELF header: no process's memory is ever written
    return perf_uprobe.open_uprobe(str(binary), site.file_offset, ref_ctr_offset=2), \
        site.function


def one_free_fd_limit() -> int:
    """An RLIMIT_NOFILE under which exactly one more file descriptor can be opened."""
    free = []
    for fd in range(65536):
        try:
            os.fstat(fd)
        except OSError:
            free.append(fd)
            if len(free) == 2:
                return free[1]
    raise AssertionError("no free descriptors")


def test_a_refused_bpf_link_marks_its_probe_not_installed(bpf, build):
    """The kernel refuses the BPF link (EMFILE: no descriptor left for the link after
    the uprobe took the last one); that probe must not be reported installed."""
    from refcntd.kernel import setup
    from refcntd.kernel.loader import Kernel
    from refcntd.kernel.program import KernelOptions
    from refcntd.kernel.records import STAGE_LINK, STAGE_OPEN
    from refcntd.session.status import probe_statuses

    plan = build_plan(load_spec("perf-stubs"), str(build.perflike("O2fp")), ENTRY)
    setup.prepare()
    env = dict(os.environ)
    with Kernel(KernelOptions(filtered=True, has_delete=plan.spec.has_delete),
                plan.sites, multi=False) as kernel:
        assert dict(os.environ) == env  # construction changes nothing outside
        saved = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (one_free_fd_limit(), saved[1]))
        try:
            kernel.probes.attach_all()  # multi=False: one perf event and one link per site
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, saved)
        failures = list(kernel.probes.failed_probes)
    first, *rest = failures
    assert (first.site_index, first.stage, first.errno) == (0, STAGE_LINK, errno.EMFILE)
    assert [(f.site_index, f.stage) for f in rest] == \
        [(i, STAGE_OPEN) for i in range(1, len(plan.sites))]
    statuses = probe_statuses(plan, failures)
    assert [s.installed for s in statuses] == [False] * len(plan.sites)
    assert statuses[0].error.startswith("bpf link failed: ")


def test_run_with_a_refused_probe_exits_incomplete(bpf, build, tmp_path, monkeypatch):
    monkeypatch.setenv("REFCNTD_PROBE_MODE", "entry")  # the conflicting uprobe is at entries
    exe = build.perflike("O2fp")
    fd, function = conflicting_uprobe(exe, "init")
    try:
        # its leaks are allowed: only the missing probe may fail the run
        result = refcntd(["run", "--max-leaks", "*=1000", "--", str(exe)], tmp_path / "r.json")
    finally:
        os.close(fd)
    assert result.returncode == 24, result.stderr
    # the file's multi-uprobe link is refused, then each site gets its own: only the
    # conflicting one fails
    assert f"probe not installed: init {function} in {exe}: uprobe_multi link failed: " \
           "invalid argument" in result.stderr
    probes = result.report["tracing"]["probes"]
    assert [p["installed"] for p in probes] == [i != 0 for i in range(len(probes))]
    notes = result.report["tracing"]["notes"]
    assert f" probe(s) in {exe} fell back to one link per site: the " \
           "multi-uprobe link was refused: invalid argument (EINVAL)" in "\n".join(notes)


def test_glob_target_reports_carry_their_own_binary_status(bpf, build, tmp_path, monkeypatch):
    monkeypatch.setenv("REFCNTD_PROBE_MODE", "entry")  # the conflicting uprobe is at entries
    """Two binaries matched by one glob, a probe refused in the second only: each
    process's report shows the status of the tracer of its own binary."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    good, bad = bindir / "a-good", bindir / "b-bad"
    for path in (good, bad):
        shutil.copy(build.perflike("O2fp"), path)
    fd, function = conflicting_uprobe(bad, "put")  # the process still leaks
    try:
        with Serve(tmp_path, target_yaml("apps", f"{bindir}/*")) as serve:
            os.close(fd)
            fd = -1
            assert f"binary={bad} probe not installed: put {function}" in serve.log
            runs = {path: subprocess.Popen([str(path)], stdout=subprocess.DEVNULL)
                    for path in (good, bad)}
            for proc in runs.values():
                assert proc.wait(timeout=60) == 0
                serve.wait_log(f"target=apps pid={proc.pid} ")
            assert serve.stop() == 0
    finally:
        if fd >= 0:
            os.close(fd)
    by_binary = {}
    for path in serve.reports.glob("*.json"):
        data = json.loads(path.read_text())
        by_binary[data["processes"][0]["command"][0]] = data
    assert set(by_binary) == {str(good), str(bad)}
    assert by_binary[str(good)]["tracing"]["complete"] is True
    assert by_binary[str(good)]["target"] == str(good)
    bad_tracing = by_binary[str(bad)]["tracing"]
    assert bad_tracing["complete"] is False
    assert [p["function"] for p in bad_tracing["probes"] if not p["installed"]] == [function]
    assert by_binary[str(bad)]["target"] == str(bad)
