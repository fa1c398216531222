"""Which culprit rules may name a function (analysis/calibration.py): pure logic; the
rules' records come from benchmarks/mutants/loco.py on real mutants."""

from __future__ import annotations

from refcntd.analysis import calibration
from refcntd.analysis.attribution import FOUND, UNKNOWN
from refcntd.analysis.calibration import Table, calibrate, trusted_counts
from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import LeakedObject, LeakGroup
from refcntd.analysis.pathops import MISSING_PUT, Culprit
from refcntd.symbolize.symbolizer import Frame


def row(cb: str, alone: tuple[str, str], against: tuple[str, str]) -> dict[str, object]:
    return {"codebase": cb, "alone": {"rule": alone[0], "outcome": alone[1]},
            "against": {"rule": against[0], "outcome": against[1]}}


def test_the_bar_is_five_percent_smoothed():
    assert trusted_counts(9, 0) and not trusted_counts(8, 0)
    assert trusted_counts(28, 1) and not trusted_counts(27, 1)
    assert not trusted_counts(0, 0)


def test_rules_are_counted_where_they_answer():
    rows = [row("a", ("first-keeper", "right"), ("good-runs", "right")),
            row("a", ("first-keeper", "wrong"), ("first-keeper", "wrong")),
            row("b", ("analog", "unknown"), ("good-runs", "wrong"))]
    table = Table.measure(rows)
    # an alone verdict a baseline left as it was is not counted twice
    assert table.counts["alone"] == {"first-keeper": (1, 1, 0), "analog": (0, 0, 1)}
    assert table.counts["against"] == {"good-runs": (1, 1, 0)}
    assert table.codebases == ("a", "b")
    assert Table.parse(table.dump()).counts == table.counts


def group(rule: str) -> LeakGroup:
    f = Frame("/bin/prog", 0x10, "keeper")
    c = Culprit(MISSING_PUT, f, (f,), 1, 1, rule=rule, why="the reason")
    return LeakGroup("widget", (f,), [LeakedObject(0x10, 1, 1, 0, 0)], culprits=[c],
                     verdict=Verdict(FOUND, c.why, [c]))


def test_an_untrusted_rule_leaves_a_candidate_not_a_culprit(monkeypatch):
    monkeypatch.delenv(calibration.ENV)
    table = Table({"alone": {"first-keeper": (3, 2, 0), "released-owner": (40, 1, 2)},
                   "against": {}}, ("a", "b"))
    weak, strong, unmeasured = group("first-keeper"), group("released-owner"), group("new")
    calibrate([weak, strong, unmeasured], table)
    assert strong.verdict is not None and strong.verdict.status == FOUND
    assert strong.culprits[0].function.function == "keeper"
    for g in (weak, unmeasured):
        assert g.verdict is not None and g.verdict.status == UNKNOWN and not g.culprits
        assert g.verdict.candidates == ("keeper",)
        assert "candidate: missing put in keeper" in g.verdict.reason
    assert weak.verdict is not None and "right 3 and wrong 2" in weak.verdict.reason
    assert unmeasured.verdict is not None and "never measured" in unmeasured.verdict.reason


def test_switched_off_for_the_benchmark_that_measures_the_rules(monkeypatch):
    monkeypatch.setattr(calibration, "ENABLED", False)
    g = group("first-keeper")
    calibrate([g], Table())
    assert g.verdict is not None and g.verdict.status == FOUND


# ---- holders deciding what the counts leave (holderevidence.py) ---------------------
def test_the_holder_explains_its_own_get_and_leaves_the_dropped_one(monkeypatch):
    monkeypatch.delenv(calibration.ENV)
    from refcntd.analysis.holderevidence import RULE, decide
    from refcntd.analysis.judging import Choice
    from refcntd.analysis.model import Pointer
    from refcntd.analysis.pathops import PathOp
    from refcntd.kernel.abi import Role

    def frames(*names: str) -> tuple[Frame, ...]:
        return tuple(Frame("/bin/perf", 0x100 + i, n) for i, n in enumerate(names))

    by_map = PathOp(Role.GET, frames("dso__get", "map__init", "map__new2"), 1)
    by_event = PathOp(Role.GET, frames("dso__get", "dsos__findnew_id",
                                       "machine__process_kernel_mmap_event"), 1)
    event = frames("dso__get", "dsos__findnew_id", "machine__process_kernel_mmap_event")
    named = [Culprit(MISSING_PUT, event[2], event, rule="first-keeper")]
    choice = Choice(0x10, 1, ((by_event, named), (by_map, "no function named")))

    def dso(pointers: tuple[Pointer, ...], holders: int) -> LeakGroup:
        obj = LeakedObject(0x10, 2, 3, 2, 0, holders=holders, pointers=pointers)
        return LeakGroup("dso", frames("dso__new"), [obj],
                         verdict=Verdict(UNKNOWN, "2 gets pair off", [], (),
                                         choices=(choice,), unattributed=1))

    held = dso((Pointer("map 0x20 .dso", 0x28, False),), 1)
    unscanned = dso((), -1)
    global_only = dso((Pointer("global dsos+0x8 (perf)", 0x30, False),), 1)
    decide([held, unscanned, global_only])
    assert held.verdict is not None and held.verdict.candidates + tuple(
        c.function.function for c in held.culprits) == ("machine__process_kernel_mmap_event",)
    assert RULE in held.verdict.reason or held.culprits[0].rule == RULE
    # nothing to go on: left as the counts left it
    for g in (unscanned, global_only):
        assert g.verdict is not None and g.verdict.reason == "2 gets pair off"


def test_the_shipped_table_never_learnt_from_the_judge_set():
    """calibration.json is loco.py's table from every codebase of benchmarks/mutants but
    perf 6.1, the set issue 55 is judged on (loco.py --judge-only)."""
    table = calibration.shipped()
    assert table.codebases and "perf61" not in table.codebases
    assert all(rule for rules in table.counts.values() for rule in rules)
