"""benchmarks/corpus.py --merge (a family at a time, then reruns of false findings) and
the causes corpus_report names for a run's losses: pure logic on results files."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import corpus  # noqa: E402
import corpus_report  # noqa: E402


def run(name: str, cls: str, lost: dict[str, int] | None = None) -> dict[str, Any]:
    o = corpus.Outcome("glib-tests", name, "gobject", [name], "clean", cls=cls,
                       lost=lost or {}, false=cls != "clean")
    return asdict(o)


def results(path: Path, runs: list[dict[str, Any]], seconds: int) -> Path:
    path.write_text(json.dumps({"machine": {"date": "d"}, "smoke": False, "specs": path.stem,
                                "seconds": seconds, "runs": runs}))
    return path


def test_a_later_file_replaces_the_same_runs_in_first_seen_order(tmp_path: Path) -> None:
    nothing = {"no probe fired in this run: nothing the spec describes was counted": 1}
    full = results(tmp_path / "full.json", [run("a", "INCOMPLETE", nothing),
                                            run("b", "clean"), run("c", "leak")], 100)
    rerun = results(tmp_path / "rerun.json", [run("a", "clean")], 7)
    doc = corpus.merged([full, rerun])
    assert [(r["name"], r["cls"]) for r in doc["runs"]] == [("a", "clean"), ("b", "clean"),
                                                            ("c", "leak")]
    assert doc["seconds"] == 107 and doc["specs"] == "rerun"
    assert doc["reevaluated"] == ("merged from full.json (specs full, 3 runs), then "
                                  "rerun.json (specs rerun, 1 runs)")


def test_each_loss_is_a_cause() -> None:
    nothing = run("a", "INCOMPLETE", {"no probe fired in this run: (...)": 1})
    ring = run("b", "INCOMPLETE", {"lifecycle events lost: ring buffer full": 3})
    assert corpus_report.causes(nothing) == [corpus_report.NO_PROBE]
    assert corpus_report.causes(ring) == [corpus_report.LOST + "lifecycle events lost: "
                                          "ring buffer full"]


def test_a_script_that_loads_no_library_is_right_only_when_refcntd_says_so() -> None:
    """'unaudited' truth (a test script none of whose processes loads libglib): right
    when refcntd says nothing of the spec's library was loaded (or, in a run made before
    that verdict, INCOMPLETE 'no probe fired'); a plain clean run is a false finding."""
    from refcntd.session.run import NOTHING_FIRED

    def judged(cls: str, nothing_loaded: bool, lost: dict[str, int]) -> bool:
        o = corpus.Outcome("glib-tests", "mkenums.py", "glib", ["x"], "unaudited", cls=cls,
                           lost=lost, nothing_loaded=nothing_loaded)
        corpus.judge(o)
        return o.false
    assert not judged("clean", True, {})
    assert not judged("INCOMPLETE", False, {NOTHING_FIRED: 1})
    assert judged("clean", False, {})
    assert judged("INCOMPLETE", False, {"lifecycle events lost: ring buffer full": 1})
