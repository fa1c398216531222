"""--baseline OLD.json: a regression's culprit found against a good run of the same
workload (issue 31), on regress.c built -O2 without frame pointers, the changed
helpers inlined where they are called.

The good build's run is the baseline.  A build that forgets a put in the
inlined map__exit leaks every mapped dso with its leftover reference got in
map__new2: alone, the run cannot say where the put went (unknown).  Against
the good run, the put at the line marked PUT is gone, and map__exit is named
with that line (and against two good runs).  A build with an extra get in the
inlined dso__load is named at the line marked GET.  `refcntd report` does the
same from the saved runs, and `run` prints each report once judged: its text
names the culprit its JSON and SARIF name (issue 39).

Runs use --no-leak-kinds: the subject here is comparisons with a good run, and the
fixtures keep what they leak in globals (sinks for the optimizer), which the default
lists as still reachable, not failing.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import FIXTURES, Build, leak_summary, refcntd

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

SOURCE = FIXTURES / "regress.c"
FLAGS = ["-fomit-frame-pointer", "-Wall", "-Werror"]


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SOURCE.read_text().splitlines(), 1)
                if f"/* {marker} */" in text)


def _run(build: Build, tmp_path: Path, variant: str, *args: str) -> tuple[int, dict, str]:
    exe = build.program(f"{variant}/regress", [SOURCE], "O2",
                        flags=[*FLAGS, *([f"-D{variant}"] if variant != "good" else [])])
    out = tmp_path / f"{variant}.json"
    result = refcntd([*RUN, "--history", *args, "--", str(exe)], out, timeout=180)
    assert result.report is not None, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.report, result.stderr


def _dso_group(report: dict) -> dict:
    (process,) = report["processes"]
    (group,) = [g for g in process["groups"] if g["type"] == "dso"]
    return group


def test_a_put_dropped_from_an_inlined_destructor_is_found_against_the_good_run(
        bpf: None, build: Build, tmp_path: Path) -> None:
    code, good, _ = _run(build, tmp_path, "good")
    assert code == 0 and good["leaked_objects"] == 0, good
    ops = good["processes"][0]["operations"]
    assert {(o["type"], o["op"]) for o in ops} >= {("dso", "put"), ("map", "put")}, ops

    code, alone, _ = _run(build, tmp_path, "DROP_PUT")
    assert code == 23
    assert leak_summary(alone["processes"][0]) == {"dso": [1] * 4}
    assert _dso_group(alone)["verdict"]["status"] == "unknown", _dso_group(alone)["verdict"]

    baseline = str(tmp_path / "good.json")
    sarif = tmp_path / "bad.sarif"
    code, bad, err = _run(build, tmp_path, "DROP_PUT", "--baseline", baseline,
                          "--sarif", str(sarif))
    assert code == 23
    group = _dso_group(bad)
    assert group["verdict"]["status"] == "culprit", group["verdict"]
    (top,) = group["culprits"]
    assert (top["kind"], top["function"], top["baseline"]) == \
        ("missing put", "map__exit", baseline), top
    assert (Path(top["file"]).name, top["line"]) == ("regress.c", _line("PUT")), top
    # the report printed as the process exited says what the JSON and SARIF say
    culprit = f"missing put in map__exit (regress.c:{_line('PUT')}), found against {baseline}"
    assert f"Likely culprit: {culprit}" in err and "Culprit unknown" not in err, err
    assert err.index("Likely culprit") < err.index("SUMMARY: refcntd: 4 objects")
    (result,) = [r for r in json.loads(sarif.read_text())["runs"][0]["results"]
                 if "leaked dso" in r["message"]["text"]]
    assert "culprit: missing put in map__exit" in result["message"]["text"], result
    assert "is a run of" not in err  # the same program: no warning
    assert "4 puts fewer" in top["why"] and "all 4 references" in top["why"], top["why"]
    assert any(n.startswith(f"without {baseline}: unknown") for n in group["verdict"]["notes"])

    # the saved runs, rendered again against two good runs: the same culprit, in text too
    second = tmp_path / "good2.json"
    (tmp_path / "good.json").rename(second)
    _run(build, tmp_path, "good")
    again = refcntd(["report", str(tmp_path / "DROP_PUT.json"), "--baseline", baseline,
                     "--baseline", str(second)])
    assert again.returncode == 23, again.stderr
    assert (f"Likely culprit: missing put in map__exit (regress.c:{_line('PUT')}), found "
            f"against {baseline} and {second}") in again.stdout, again.stdout


def test_an_extra_get_in_an_inlined_helper_is_found_against_the_good_run(
        bpf: None, build: Build, tmp_path: Path) -> None:
    _run(build, tmp_path, "good")
    baseline = str(tmp_path / "good.json")
    code, bad, _ = _run(build, tmp_path, "EXTRA_GET", "--baseline", baseline)
    assert code == 23
    group = _dso_group(bad)
    (top,) = group["culprits"]
    assert (top["kind"], top["function"]) == ("extra get", "dso__load"), top
    assert (Path(top["file"]).name, top["line"]) == ("regress.c", _line("GET")), top


def test_a_baseline_without_operation_counts_is_said_and_changes_nothing(
        bpf: None, build: Build, tmp_path: Path) -> None:
    """A baseline run without --history has no per-path counts: one line says so, and
    the run's own verdicts stand."""
    exe = build.program("good/regress", [SOURCE], "O2", flags=FLAGS)
    plain = refcntd([*RUN, "--", str(exe)], tmp_path / "plain.json", timeout=180)
    assert plain.returncode == 0, plain.stderr
    code, bad, err = _run(build, tmp_path, "DROP_PUT", "--baseline", str(tmp_path / "plain.json"))
    assert code == 23
    assert "have no operation counts (a run without --history" in err, err
    assert _dso_group(bad)["verdict"]["status"] == "unknown"
