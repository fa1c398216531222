"""--baseline's growth rule on findings (issue 39), without BPF: sizes from good
runs, what fails, what the text says; the BPF side is tests/bpf/test_baseline_growth.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from refcntd.analysis.model import (
    AnomalyFinding,
    LeakedObject,
    LeakGroup,
    ProcessReport,
    RunResult,
)
from refcntd.cli.main import main
from refcntd.outputs import ciformats, reportjson
from refcntd.outputs.policy import BASELINE, FAILING, UNDER_THRESHOLD, Policy
from refcntd.symbolize.symbolizer import Frame

STACK = (Frame("/bin/c", 0x10, "map__new", 4), Frame("/bin/c", 0x20, "machine__init", 8),
         Frame("/bin/c", 0x30, "main", 8))


def _run(objects: int, count: int = 1, target: str = "/ci/build/c", spec: str = "s",
         processes: int = 1) -> RunResult:
    group = LeakGroup("map", STACK, [LeakedObject(0x100 + i, count, count, 0, 0)
                                     for i in range(objects)])
    return RunResult("run", spec, target, [ProcessReport(1 + p, "c", [target], "exited",
                                                         groups=[group])
                                           for p in range(processes)])


def _save(tmp_path: Path, name: str, run: RunResult) -> str:
    path = tmp_path / name
    reportjson.write_json(run, str(path))
    return str(path)


def test_growth_beyond_the_larger_good_run_fails_with_the_figures(tmp_path: Path) -> None:
    olds = [_save(tmp_path, "a.json", _run(1, 3)), _save(tmp_path, "b.json", _run(2, 1))]
    policy = Policy.build(None, olds, [])
    assert list(policy.baseline.values()) == [(2, 3)]  # objects of b, references of a
    (grown,) = policy.evaluate(_run(6, 172)).findings
    assert grown.status == FAILING and grown.grown
    assert grown.growth() == "2 -> 6 objects (+4), 3 -> 1 032 references (+1 029)"
    text = ciformats.verdict_text(_run(6, 172), policy.evaluate(_run(6, 172)))
    assert ("refcntd: grew since the baseline: map at map__new < machine__init < main: "
            "2 -> 6 objects (+4), 3 -> 1 032 references (+1 029)\n") in text, text
    (smaller,) = policy.evaluate(_run(2, 1)).findings  # no larger than the larger: passes
    assert (smaller.status, smaller.reason) == (BASELINE, "present in the baseline, smaller now: "
                                            "2 -> 2 objects, 3 -> 2 references (-1)")


def test_a_run_folds_its_processes_before_it_is_compared(tmp_path: Path) -> None:
    policy = Policy.build(None, [_save(tmp_path, "one.json", _run(1))], [])
    (twice,) = policy.evaluate(_run(1, processes=2)).findings
    assert twice.status == FAILING and twice.growth() == \
        "1 -> 2 objects (+1), 1 -> 2 references (+1)"


def test_thresholds_count_the_objects_beyond_the_baseline(tmp_path: Path) -> None:
    base = _save(tmp_path, "one.json", _run(1))
    (under,) = Policy.build(None, [base], ["map=5"]).evaluate(_run(6)).findings
    assert under.status == UNDER_THRESHOLD, under
    assert under.reason.startswith("5 leaked map objects beyond the baseline <= 5 (grew")
    assert Policy.build(None, [base], ["map=4"]).evaluate(_run(6)).failing()
    # more references on as many objects: a limit on objects does not excuse it
    assert Policy.build(None, [base], ["*=100"]).evaluate(_run(1, 9)).failing()


def test_a_baseline_of_another_program_or_spec_is_named(tmp_path: Path) -> None:
    olds = [_save(tmp_path, "same.json", _run(1, target="/elsewhere/c")),
            _save(tmp_path, "spec.json", _run(1, spec="other")),
            _save(tmp_path, "prog.json", _run(1, target="./d"))]
    notes = Policy.build(None, olds, []).other_programs(_run(1))
    assert [n.split(" is a run of ")[0] for n in notes] == \
        [f"warning: --baseline {olds[1]}", f"warning: --baseline {olds[2]}"]
    assert "is a run of c (spec other), this one of c (spec s)" in notes[0]


def test_report_says_it_once_on_stderr(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    saved = _save(tmp_path, "new.json", _run(6))
    other = _save(tmp_path, "other.json", _run(1, target="d"))
    assert main(["report", saved, "--baseline", other]) == 23
    out, err = capsys.readouterr()
    assert err.count("is a run of d (spec s), this one of c (spec s)") == 1, err
    assert "1 -> 6 objects (+5)" in out


def test_an_anomaly_that_occurs_more_often_fails(tmp_path: Path) -> None:
    def run(occurrences: int) -> RunResult:
        put = AnomalyFinding("double-put", "map", 0x100, 0, STACK, (), occurrences)
        return RunResult("run", "s", "c", [ProcessReport(1, "c", ["c"], "exited",
                                                         anomalies=[put])])
    policy = Policy.build(None, [_save(tmp_path, "one.json", run(1))], [])
    (more,) = policy.evaluate(run(3)).findings
    assert more.status == FAILING and more.growth() == "1 -> 3 occurrences (+2)"
    assert "double-put on map at map__new < machine__init < main: 1 -> 3 occurrences (+2)" \
        in ciformats.verdict_text(run(3), policy.evaluate(run(3)))
    assert policy.evaluate(run(1)).findings[0].status == BASELINE
