"""--baseline and growth at a known site (issue 39): a finding the baseline has
fails when it grew, more objects or more references than in every good run,
and the outputs say by how much; equal passes; smaller passes, said in a note.

Real BPF on cachegrow.c (-O2, built by the test): a cache that keeps one
reference too many per entry, `cache ENTRIES KEPT` leaking exactly ENTRIES
objects with KEPT references each, all at entry_new < cache_fill < main.
Runs with other knobs stand for the runs before and after a change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest
from conftest import FIXTURES, ROOT, Build, Result, refcntd
from test_ci import SARIF_SCHEMA

SITE = "entry at entry_new < cache_fill < main < ..."


@pytest.fixture(scope="module")
def cache(bpf: None, build: Build) -> Path:
    return build.program("cachegrow", [FIXTURES / "cachegrow.c"], "O2",
                         flags=["-Wall", "-Werror"])


def _run(cache: Path, out: Path, knobs: tuple[int, int], *args: str,
         env: dict[str, str] | None = None) -> Result:
    result = refcntd(["run", *args, "--", str(cache), *map(str, knobs)], out, env=env,
                     timeout=180)
    assert result.report is not None, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    assert (len(group["instances"]), sum(i["count"] for i in group["instances"])) == \
        (knobs[0], knobs[0] * knobs[1]), group  # the known truth, before any policy
    return result


def _report(saved: Path, *args: str) -> Result:
    result = refcntd(["report", str(saved), *args])
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_growth_at_a_known_site_fails_with_the_numbers(cache: Path, tmp_path: Path) -> None:
    one, four, six = (tmp_path / f"{n}.json" for n in ("one", "four", "six"))
    assert _run(cache, one, (1, 1)).returncode == 23  # alone, its leak fails
    _run(cache, four, (4, 1))
    sarif, junit, summary = (tmp_path / n for n in ("six.sarif", "six.xml", "summary.md"))
    env = dict(os.environ, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary))
    grown = _run(cache, six, (6, 1), "--baseline", str(one), "--sarif", str(sarif),
                 "--junit", str(junit), "--source-root", str(ROOT), env=env)
    assert grown.returncode == 23, grown.stderr
    numbers = "1 -> 6 objects (+5), 1 -> 6 references (+5)"
    assert f"refcntd: grew since the baseline: {SITE}: {numbers}" in grown.stderr, grown.stderr
    assert "1 failing finding(s) (1 grown since the baseline), 0 suppressed, 0 in baseline" \
        in grown.stderr
    assert "is a run of" not in grown.stderr  # the same program: no warning

    document = json.loads(sarif.read_text())
    jsonschema.Draft4Validator(SARIF_SCHEMA).validate(document)
    (result,) = document["runs"][0]["results"]
    assert result["baselineState"] == "updated" and "suppressions" not in result, result
    assert f"grown since the baseline ({numbers})" in result["message"]["text"]
    assert f"grew since the baseline: {numbers}" in junit.read_text().replace("&gt;", ">")
    (annotation,) = [line for line in grown.stdout.splitlines() if line.startswith("::")]
    assert annotation.startswith("::error ") and numbers in annotation, annotation
    assert f"| failing (grew: {numbers}) | 6 leaked entry object(s)" in summary.read_text()

    # report --baseline: the same verdict from the saved runs; against two good runs,
    # growth is beyond the larger of them, and equal to it passes
    again = _report(six, "--baseline", str(one))
    assert again.returncode == 23 and f"{SITE}: {numbers}" in again.stdout, again.stdout
    both = _report(six, "--baseline", str(one), "--baseline", str(four))
    assert both.returncode == 23
    assert f"{SITE}: 4 -> 6 objects (+2), 4 -> 6 references (+2)" in both.stdout, both.stdout
    assert _report(four, "--baseline", str(one), "--baseline", str(four)).returncode == 0

    # --max-leaks counts the objects beyond the baseline: 5 new ones here
    assert _report(six, "--baseline", str(one), "--max-leaks", "entry=5").returncode == 0
    assert _report(six, "--baseline", str(one), "--max-leaks", "entry=4").returncode == 23


def test_more_references_on_as_many_objects_fail(cache: Path, tmp_path: Path) -> None:
    """One get more per entry, on the same entries: the objects stay, the references
    grow; a limit on objects does not excuse it."""
    one, more = tmp_path / "one.json", tmp_path / "more.json"
    _run(cache, one, (2, 1))
    grown = _run(cache, more, (2, 3), "--baseline", str(one))
    assert grown.returncode == 23, grown.stderr
    assert f"{SITE}: 2 -> 2 objects, 2 -> 6 references (+4)" in grown.stderr, grown.stderr
    assert _report(more, "--baseline", str(one), "--max-leaks", "*=10").returncode == 23


def test_equal_passes_and_smaller_passes_with_a_note(cache: Path, tmp_path: Path) -> None:
    six, again, one = (tmp_path / f"{n}.json" for n in ("six", "again", "one"))
    _run(cache, six, (6, 1))
    equal = _run(cache, again, (6, 1), "--baseline", str(six))
    assert equal.returncode == 0, equal.stderr
    site = "at entry_new < cache_fill < main < ..."
    assert f"refcntd: in baseline: 6 leaked entry object(s) {site} (present in the baseline)\n" \
        in equal.stderr, equal.stderr
    sarif = tmp_path / "one.sarif"
    smaller = _run(cache, one, (1, 1), "--baseline", str(six), "--sarif", str(sarif))
    assert smaller.returncode == 0, smaller.stderr
    note = ("present in the baseline, smaller now: 6 -> 1 objects (-5), "
            "6 -> 1 references (-5)")
    assert f"refcntd: in baseline: 1 leaked entry object(s) {site} ({note})" in smaller.stderr
    assert "grew" not in smaller.stderr
    (result,) = json.loads(sarif.read_text())["runs"][0]["results"]
    assert result["suppressions"][0]["justification"] == note
    assert result["baselineState"] == "updated"


def test_a_baseline_of_another_program_is_said_in_one_line(
        cache: Path, build: Build, tmp_path: Path) -> None:
    churn = build.program("churn", [FIXTURES / "churn.c"], "O2")
    other = tmp_path / "churn.json"
    assert refcntd(["run", "--", str(churn), "4"], other).returncode == 0
    run = _run(cache, tmp_path / "six.json", (6, 1), "--baseline", str(other))
    assert run.returncode == 23  # its findings are all new against it
    warning = (f"refcntd: warning: --baseline {other} is a run of churn (spec perf-stubs), "
               "this one of cachegrow (spec perf-stubs): findings and culprits are compared "
               "with it all the same (give a run of this program on the code before the "
               "change)\n")
    assert run.stderr.count(warning) == 1, run.stderr
    assert warning in _report(tmp_path / "six.json", "--baseline", str(other)).stderr
