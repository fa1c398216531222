"""One verdict everywhere (issue 54, items 5 and 6): `refcntd report RUN.json` judges a
saved run as the `run` that wrote it did, with run's verdict options; the closing
lines say only what the run's options and findings have."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.cli.main import main
from refcntd.outputs import ciformats, report, reportjson
from refcntd.outputs.policy import LATE, NOT_JUDGED, REACHABLE, Policy
from refcntd.outputs.runjson import load_run
from refcntd.symbolize.symbolizer import Frame


def group(kind: str, n: int = 3, site: str = "make", type_name: str = "obj") -> LeakGroup:
    frames = (Frame("/bin/t", 0x1000, site, 4, "t.c", 5), Frame("/bin/t", 0x2000, "main", 8))
    return LeakGroup(type_name, frames, [LeakedObject(0x100 * (i + 1), 1, 0, 0, 0, kind=kind)
                                         for i in range(n)], kind=kind)


def saved(tmp_path: Path, *groups: LeakGroup, status: str = "exit 0",
          leak_kinds: bool = True) -> Path:
    proc = ProcessReport(7, "t", ["t"], "exited", status, 0, list(groups))
    result = RunResult("run", "perf-stubs", "/bin/t", [proc], command_status=0)
    result.leak_kinds = leak_kinds
    path = tmp_path / "run.json"
    reportjson.write_json(result, str(path))
    return path


def report_cli(path: Path, capsys: pytest.CaptureFixture[str], *options: str
               ) -> tuple[int, str]:
    code = main(["report", str(path), *options])
    return code, capsys.readouterr().out


def test_all_reachable_passes_in_report_as_in_run(tmp_path, capsys):
    """The maintainer's case: 3 objects still reachable from a global; run exits 0."""
    path = saved(tmp_path, group(REACHABLE))
    assert load_run(str(path)).leak_kinds
    code, out = report_cli(path, capsys)
    assert code == 0, out
    assert out.splitlines()[-1] == "refcntd: 0 failing finding(s), 0 suppressed, 1 still reachable"
    code, out = report_cli(path, capsys, "--fail-on", "reachable")
    assert code == 23 and "refcntd: 1 failing finding(s), 0 suppressed" in out


def test_killed_processes_are_judged_as_run_judged_them(tmp_path, capsys):
    path = saved(tmp_path, group("definitely lost"), status="killed by SIGKILL")
    assert report_cli(path, capsys)[0] == 0
    assert report_cli(path, capsys, "--judge-killed")[0] == 23
    # a run without leak kinds judged every object alive at exit as a leak
    assert report_cli(saved(tmp_path, group(""), status="killed by SIGKILL",
                            leak_kinds=False), capsys)[0] == 23


def test_a_run_saved_without_the_field_is_judged_by_its_kinds(tmp_path):
    path = saved(tmp_path, group(REACHABLE))
    doc = json.loads(path.read_text())
    del doc["leak_kinds"]
    path.write_text(json.dumps(doc))
    assert load_run(str(path)).leak_kinds
    doc["processes"][0]["groups"][0]["kind"] = ""
    path.write_text(json.dumps(doc))
    assert not load_run(str(path)).leak_kinds


def test_the_tally_names_only_what_was_asked_or_found(tmp_path):
    result = load_run(str(saved(tmp_path, group("definitely lost"))))
    last = ciformats.verdict_text(result, Policy(lsan=True).evaluate(result)).splitlines()[-1]
    assert last == "refcntd: 1 failing finding(s), 0 suppressed"
    policy = Policy.build(None, [str(tmp_path / "run.json")], ["obj=5"])
    last = ciformats.verdict_text(result, policy.evaluate(result)).splitlines()[-1]
    assert last == "refcntd: 0 failing finding(s), 0 suppressed, 1 in baseline, " \
        "0 under thresholds"


def test_still_reachable_objects_are_not_called_leaked(tmp_path):
    result = load_run(str(saved(tmp_path, group(REACHABLE), group("definitely lost", 1,
                                                                   site="other"))))
    (proc,) = result.processes
    assert report.summary_line(proc) == ("SUMMARY: refcntd: 4 objects of 1 type alive at "
                                         "exit in process 7 (t): 1 leaked, 3 still reachable")
    assert "4 objects of 1 type alive at exit in 1 process (1 leaked, 3 still reachable)" \
        in report.render_run(result)
    only = load_run(str(saved(tmp_path, group("definitely lost"))))
    assert "3 objects of 1 type leaked in process 7" in report.summary_line(only.processes[0])
    text = ciformats.verdict_text(result, Policy(lsan=True).evaluate(result))
    assert "refcntd: still reachable at exit: 3 obj object(s) at make < main (" in text, text
    assert "leaked obj" not in text.replace("1 leaked obj", "")


def test_not_judged_findings_without_a_site_fold_into_one_line(tmp_path):
    groups = [group(LATE, 1, site=f"f{i}", type_name=("A", "B")[i % 2]) for i in range(13)]
    result = load_run(str(saved(tmp_path, *groups)))
    text = ciformats.verdict_text(result, Policy(lsan=True).evaluate(result))
    lines = [line for line in text.splitlines() if line.startswith(f"refcntd: {NOT_JUDGED}")]
    assert len(lines) == 1 and lines[0].startswith("refcntd: not judged: 13 A/B object(s) at "
                                                   "13 sites (created after the exit scan"), text
    assert text.splitlines()[-1].endswith(", 13 not judged")


def test_many_still_reachable_findings_share_one_line(tmp_path):
    groups = [group(REACHABLE, 2, site=f"f{i}", type_name="GObject") for i in range(5)]
    result = load_run(str(saved(tmp_path, *groups)))
    text = ciformats.verdict_text(result, Policy(lsan=True).evaluate(result))
    assert text.splitlines() == [
        "refcntd: still reachable at exit: 10 GObject object(s) at 5 sites (--fail-on "
        "reachable fails them)", "refcntd: 0 failing finding(s), 0 suppressed, 5 still reachable"]


def test_objects_at_count_0_are_set_aside_with_a_note():
    from refcntd.analysis.released import set_aside_released

    finalizing = LeakGroup("GTask", (), [LeakedObject(0x10, 0, 1, 2, 0)])
    mixed = LeakGroup("obj", (), [LeakedObject(0x20, 0, 0, 1, 0), LeakedObject(0x30, 2, 1, 0, 0)])
    held = LeakGroup("obj", (), [LeakedObject(0x40, 1, 0, 0, 0)])
    groups, note = set_aside_released([finalizing, mixed, held])
    assert [[o.address for o in g.objects] for g in groups] == [[0x30], [0x40]]
    assert groups[1] is held and note.startswith("2 object(s) at count 0 when the process")
    assert set_aside_released([held]) == ([held], "")
