"""`refcntd report RUN.json` gives the verdict and exit status of the `run` that wrote
it, under the same verdict options (issue 54, item 5; docs/commands/report.md): saved
runs with only still reachable objects, lost ones, both, an anomaly, a killed process,
and a run judged against a baseline."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd

VERDICT = re.compile(r"^(SUMMARY: |refcntd: (\d+ failing|still reachable|not judged|"
                     r"suppressed|in baseline|under threshold|grew since|unused))")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("verdicts")
    sources = [FIXTURES / "verdicts.c", EXAMPLES / "refcnt.c"]
    return cc(out / "verdicts", sources, ["-O2", "-pthread"])


def verdict_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if VERDICT.match(line)]


def run_then_report(exe, path, mode, *options):
    run = refcntd(["run", *options, "--", str(exe), mode], path)
    assert run.report is not None, run.stderr
    again = refcntd(["report", str(path), *options])
    assert (again.returncode, verdict_lines(again.stdout)) == \
        (run.returncode, verdict_lines(run.stderr)), (run.stderr, again.stdout, again.stderr)
    return run


@pytest.mark.parametrize(("mode", "options", "status", "last"), [
    ("reachable", (), 0, "0 failing finding(s), 0 suppressed, 1 still reachable"),
    ("reachable", ("--fail-on", "reachable"), 23, "1 failing finding(s), 0 suppressed"),
    ("lost", (), 23, "1 failing finding(s), 0 suppressed"),
    ("mixed", (), 23, "1 failing finding(s), 0 suppressed, 1 still reachable"),
    ("anomaly", (), 23, "1 failing finding(s), 0 suppressed"),
    ("killed", (), 137, "0 failing finding(s), 0 suppressed, 1 not judged"),
    ("killed", ("--judge-killed",), 23, "1 failing finding(s), 0 suppressed"),
])
def test_report_judges_a_saved_run_as_run_did(bpf, exe, tmp_path, mode, options, status, last):
    run = run_then_report(exe, tmp_path / "r.json", mode, *options)
    assert run.returncode == status
    assert verdict_lines(run.stderr)[-1] == f"refcntd: {last}"


def test_report_against_a_baseline_judges_as_run_did(bpf, exe, tmp_path):
    old = tmp_path / "old.json"
    assert refcntd(["run", "--", str(exe), "lost"], old).returncode == 23
    run = run_then_report(exe, tmp_path / "new.json", "mixed", "--baseline", str(old))
    assert run.returncode == 0
    assert verdict_lines(run.stderr)[-1] == \
        "refcntd: 0 failing finding(s), 0 suppressed, 1 in baseline, 1 still reachable"


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_process_is_named_after_its_program_not_its_last_thread(bpf, exe, tmp_path,
                                                                   wrapped):
    """The main thread leaves first and a thread named pool-7 ends the process (GLib's
    gmain and pool threads do): the report names the program, also when a shell's
    child exec'd it."""
    command = ["sh", "-c", f"{exe} lastthread; true"] if wrapped else [str(exe), "lastthread"]
    run = refcntd(["run", "--", *command], tmp_path / "r.json")
    assert run.returncode == 23, run.stderr
    (process,) = [p for p in run.report["processes"] if p["groups"]]
    assert process["comm"] == "verdicts", run.stderr
    assert f"in process {process['pid']} (verdicts)" in run.stderr
    assert "pool-7" not in run.stderr


def test_an_object_mid_finalize_at_exit_is_not_a_finding(bpf, exe, tmp_path):
    """A thread made the last put (count 0) and has not reached the delete when main
    exits (a GObject finalized on a pool thread): no reference is held, so it is no
    leak, not "still reachable ... final count 0", and no JUnit case of its own, which
    would come and go with the timing."""
    junit = tmp_path / "j.xml"
    run = refcntd(["run", "--junit", str(junit), "--", str(exe), "finalizing"],
                  tmp_path / "r.json")
    assert run.returncode == 23, run.stderr
    (process,) = run.report["processes"]
    assert [i["count"] for g in process["groups"] for i in g["instances"]] == [1]
    assert any(n.startswith("1 object(s) at count 0 when the process ended")
               for n in process["notes"]), process["notes"]
    assert "final count 0" not in run.stderr
    assert junit.read_text().count("<testcase ") == 1
