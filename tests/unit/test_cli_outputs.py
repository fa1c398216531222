"""Renderers under hostile names; deterministic order; SARIF base ids (issue 18)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from refcntd.analysis.model import (
    LeakedObject,
    LeakGroup,
    ProbeStatus,
    ProcessReport,
    RunResult,
    TracingStatus,
)
from refcntd.cli.main import main
from refcntd.outputs import ciformats, report, reportjson
from refcntd.outputs.policy import Policy
from refcntd.symbolize.symbolizer import Frame

EVIL = "obj\x1b[31m\x01\n::error::x\x7f"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def evil_result(root: Path) -> RunResult:
    src = str(root / "src" / "main.c")
    frames = (Frame("/bin/x", 0x1000, "make\x1bobj", 4, src, 12),
              Frame("/bin/x", 0x2000, "main", 8, src, 30))
    group = LeakGroup(EVIL, frames, [LeakedObject(0x1000, 1, 1, 0, 7)])
    procs = [ProcessReport(42, "x\x1b", ["x", "a\x01"], "exited", "exit 0", 0, [group])]
    return RunResult("run", "perf-stubs", "x", procs)


def test_control_characters_escaped_everywhere(tmp_path: Path) -> None:
    result = evil_result(tmp_path)
    verdict = Policy.build(None, [], []).evaluate(result)
    texts = {"terminal": "".join(report.render_process(p) for p in result.processes)
             + report.render_run(result) + ciformats.verdict_text(result, verdict),
             "junit": ciformats.junit(result, verdict),
             "github": "\n".join(ciformats.github_annotations(result, verdict, tmp_path)),
             "summary": ciformats.github_summary(result, verdict)}
    for name, text in texts.items():
        assert not RAW_CONTROL.search(text), (name, text)
        assert "\\x1b" in text and "\\x01" in text, (name, text)
    ET.fromstring(texts["junit"].split("\n", 1)[1])  # well-formed XML
    # the newline in the type name cannot start a second workflow command
    assert all(line.startswith("::") for line in texts["github"].splitlines())
    assert len(texts["github"].splitlines()) == 1
    assert "obj\\x1b[31m\\x01\\x0a::error::x\\x7f" in texts["terminal"]


def leaky_result(root: Path, sites: int = 3) -> RunResult:
    """Groups of equal size and type that differ only by stack: their order must not
    depend on the order they were found in."""
    src = str(root / "src" / "main.c")
    groups = [LeakGroup("dso", (Frame("/bin/x", 0x1000 + i, f"site{i}", 4, src, 10 + i),
                                Frame("/bin/x", 0x2000, "main", 8, src, 30)),
                        [LeakedObject(0x1000 + i, 1, 1, 0, 7)]) for i in range(sites)]
    return RunResult("run", "perf-stubs", "x",
                     [ProcessReport(42, "x", ["x"], "exited", "exit 0", 0, groups)])


def test_sarif_records_its_root_and_warns_on_another(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "run.json"
    reportjson.write_json(leaky_result(tmp_path), str(saved))
    assert main(["report", str(saved), "--format", "sarif", "--source-root", str(tmp_path)]) == 23
    out = capsys.readouterr()
    run = json.loads(out.out)["runs"][0]
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == tmp_path.resolve().as_uri() + "/"
    for r in run["results"]:
        art = r["locations"][0]["physicalLocation"]["artifactLocation"]
        assert art == {"uri": "src/main.c", "uriBaseId": "SRCROOT"}
    assert "warning" not in out.err
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert main(["report", str(saved), "--format", "sarif", "--source-root", str(other)]) == 23
    err = capsys.readouterr().err
    assert "warning: 3 finding(s) have no source file under --source-root" in err
    assert str(other) in err


def test_order_and_case_names_do_not_depend_on_discovery_order(tmp_path: Path) -> None:
    one, two = leaky_result(tmp_path), leaky_result(tmp_path)
    two.processes[0].groups.reverse()
    assert [g.key() for g in sorted(one.processes[0].groups, key=LeakGroup.order)] == \
        [g.key() for g in sorted(two.processes[0].groups, key=LeakGroup.order)]
    names = []
    for result in (one, two):
        verdict = Policy.build(None, [], []).evaluate(result)
        xml = ET.fromstring(ciformats.junit(result, verdict).split("\n", 1)[1])
        names.append([c.get("name", "") for c in xml.iter("testcase")])
    assert names[0] == names[1]
    assert [n.split(" [")[0] for n in names[0]] == \
        [f"leak dso at site{i} < main" for i in range(3)]  # no counts in the names


def test_strict_fails_a_degraded_report(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    frames = (Frame("", 0x7f00, raw="ip 0x7f00"), Frame("/bin/x", 0x2000, "main", 8))
    group = LeakGroup("<type name at 0x4010>", frames, [LeakedObject(0x1000, 1, 1, 0, 7)])
    fired = TracingStatus([ProbeStatus("get", "__refcnt__get", "x", 0, "", "", True, hits=3)])
    clean = RunResult("run", "perf-stubs", "x",
                      [ProcessReport(42, "x", ["x"], "exited", "exit 0", 0, [])], fired)
    degraded = RunResult("run", "perf-stubs", "x",
                         [ProcessReport(42, "x", ["x"], "exited", "exit 0", 0, [group])], fired)
    silent = RunResult("run", "perf-stubs", "x", clean.processes, TracingStatus())
    saved = {name: tmp_path / f"{name}.json" for name in ("clean", "degraded", "silent")}
    for name, result in (("clean", clean), ("degraded", degraded), ("silent", silent)):
        reportjson.write_json(result, str(saved[name]))
    limits = ["--max-leaks", "*=5"]  # the leak itself does not fail: only --strict may
    assert main(["report", str(saved["degraded"]), *limits]) == 0
    assert main(["report", str(saved["clean"]), "--strict"]) == 0
    capsys.readouterr()
    assert main(["report", str(saved["silent"]), "--strict"]) == 24  # nothing probed: issue 39
    assert capsys.readouterr().err.splitlines()[-1] == "refcntd: --strict: no probe fired"
    assert main(["report", str(saved["degraded"]), "--strict", *limits]) == 24
    (line,) = capsys.readouterr().err.splitlines()
    assert line == "refcntd: --strict: 1 unresolved frame(s); 1 unreadable type name(s)"


@pytest.mark.parametrize("probe", ["entry", "return"])
def test_github_summary_where_skips_only_the_probed_function(tmp_path: Path, probe: str
                                                            ) -> None:
    """An entry probe's stack starts in the probed function (skipped); a return probe's
    (a constructor's) at its caller already, which must stay."""
    src = str(tmp_path / "main.c")
    frames = (Frame("/bin/x", 0x1000, "handle", 4, src, 12),
              Frame("/bin/x", 0x2000, "main", 8, src, 30))
    if probe == "entry":
        frames = (Frame("/bin/x", 0x900, "buf_new", 0, src, 3), *frames)
    group = LeakGroup("buf", frames, [LeakedObject(0x1000, 1, 1, 0, 7)])
    result = RunResult("run", "s", "x", [ProcessReport(42, "x", ["x"], "exited", "exit 0", 0,
                                                       [group])])
    result.tracing = TracingStatus([ProbeStatus("init", "buf_new", "/bin/x", 0, "", "", True)])
    summary = ciformats.github_summary(result, Policy.build(None, [], []).evaluate(result))
    assert "`handle+0x4 (main.c:12) < main`" in summary, summary
