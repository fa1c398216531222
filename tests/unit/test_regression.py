"""--baseline: a culprit from the operations of two runs of the same workload
(analysis.regression); the BPF side is tests/bpf/test_against_baseline.py."""

from __future__ import annotations

from refcntd.analysis.attribution import UNKNOWN
from refcntd.analysis.baseline import against
from refcntd.analysis.judging import Verdict
from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult, TracingStatus
from refcntd.analysis.pathops import PathOp
from refcntd.analysis.regression import call_site, changes, regression
from refcntd.kernel.abi import Role
from refcntd.symbolize.symbolizer import Frame


def op(role: Role, path: str, count: int = 1, module: str = "perf") -> PathOp:
    return PathOp(role, tuple(Frame(module, 0x1000 + i, n, line=10 + i)
                              for i, n in enumerate(path.split())), count)


# perf's dsos, as a good run counts them: a map's destructor puts its dso
GOOD = [op(Role.INIT, "dso__new dsos__findnew main", 8),
        op(Role.GET, "dso__get map__new2 main", 4),
        op(Role.PUT, "dso__put dso__put __dso__zput map__exit map__delete map__put main", 4),
        op(Role.GET, "dso__get load_all main", 4),
        op(Role.PUT, "dso__put load_all main", 4),
        op(Role.PUT, "dso__put main", 8)]


def test_the_call_is_made_past_the_apis_own_functions_inlined_or_not() -> None:
    assert call_site(GOOD[2]) == 3  # dso__put, dso__put (inlined), __dso__zput: map__exit
    assert call_site(GOOD[1]) == 1
    assert call_site(op(Role.PUT, "update_degree gst_bin_sort main")) == 0  # probed API
    assert call_site(op(Role.PUT, "gst_object_unref _gst_message_free main")) == 1
    assert call_site(op(Role.PUT, "dso__put")) == 0  # never past the last frame


def test_a_put_lost_in_a_destructor_is_named_with_the_good_runs_line() -> None:
    bad = [o for o in GOOD if o is not GOOD[2]]
    found = regression("dso", [GOOD], bad, "good.json")
    assert found.culprit is not None, found.reason
    c = found.culprit
    assert (c.kind, c.function.function, c.function.line, c.references) == \
        ("missing put", "map__exit", 13, 4)
    assert [f.function for f in c.frames][-1] == "map__exit"
    assert "map__exit made 4 puts fewer at" not in c.why  # no file: no "at"
    assert c.why.startswith("map__exit made 4 puts fewer than in good.json: all 4 references")


def test_an_added_get_is_named_and_builds_compare_by_name() -> None:
    """The other build sits at another path and gcc renamed a clone: still one function."""
    bad = [PathOp(o.op, tuple(Frame("perf-new", f.vaddr, f.function.replace(
        "load_all", "load_all.isra.0"), line=f.line) for f in o.frames), o.count) for o in GOOD]
    bad.append(op(Role.GET, "dso__get load_all.isra.0 main", 4, "perf-new"))
    found = regression("dso", [GOOD], bad, "good.json")
    assert found.culprit is not None, found.reason
    assert (found.culprit.kind, found.culprit.function.function) == \
        ("extra get", "load_all.isra.0")


def test_a_teardown_that_no_longer_runs_does_not_hide_the_cause() -> None:
    """perf's comm__override forgets comm_str__put: the last put of each comm_str
    never comes, so comm_strs__remove_if_last, run by that put, drops the set's
    reference no more.  Both lost puts; only comm__override's is a cause."""
    good = [op(Role.INIT, "comm_strs__findnew comm__new main", 2),
            op(Role.GET, "comm_str__get comm__override main", 2),
            op(Role.PUT, "comm_str__put comm__override main", 2),
            op(Role.PUT, "comm_str__put comm_strs__remove_if_last comm_str__put comm__free main",
               2)]
    bad = [good[0], good[1], good[3]][:2]
    found = regression("comm_str", [good], bad, "good.json")
    assert found.culprit is not None, found.reason
    assert found.culprit.function.function == "comm__override"
    assert "comm_strs__remove_if_last: in a put's teardown" in found.culprit.why
    assert {(c.function, c.nested) for c in changes(good, bad)} == \
        {("comm__override", False), ("comm_strs__remove_if_last", True)}


def test_two_functions_that_kept_more_are_not_guessed_between() -> None:
    """Outside any teardown, two functions changed: the change is in one of them, or
    the runs did different work.  (A teardown's lost puts beside one such function
    are taken as its consequence: the comm_str case above.)"""
    bad = [o for o in GOOD if o is not GOOD[4]] + [op(Role.PUT, "dso__put load_all main", 3),
                                                   op(Role.GET, "dso__get map__new2 main", 1)]
    found = regression("dso", [GOOD], bad, "good.json")
    assert found.culprit is None
    assert found.kept == 2
    assert "by 2 functions (load_all +1, map__new2 +1)" in found.reason, found.reason


def test_nothing_is_said_when_no_more_references_are_kept() -> None:
    found = regression("dso", [GOOD], GOOD, "good.json")
    assert (found.culprit, found.kept) == (None, 0)


def _process(command: str, ops: list[PathOp], objects: int = 0, verdict: Verdict | None = None
             ) -> ProcessReport:
    groups = [LeakGroup("dso", (Frame("perf", 1, "dso__new"),),
                        [LeakedObject(0x100 + i, 1, 1, 0, 0) for i in range(objects)],
                        verdict=verdict)] if objects else []
    return ProcessReport(1, "perf", command.split(), "exited", groups=groups,
                         operations={"dso": ops} if ops else {})


def _run(*procs: ProcessReport) -> RunResult:
    return RunResult("run", "perf.yaml", "", list(procs), TracingStatus())


def test_against_names_the_culprit_of_new_groups_only() -> None:
    alone = Verdict(UNKNOWN, "map__new2 stored the reference")
    bad = _run(_process("./perf-new test", [o for o in GOOD if o is not GOOD[2]], 4, alone))
    assert against(bad, [_run(_process("./perf test", GOOD))], "good.json") == []
    (group,) = bad.processes[0].groups
    assert group.verdict is not None and group.verdict.status == "culprit"
    assert group.culprits[0].function.function == "map__exit"
    assert (group.culprits[0].baseline, group.culprits[0].objects) == ("good.json", 4)
    assert group.verdict.notes == ("without good.json: unknown (map__new2 stored the reference)",)

    # the same group leaked as much in the good run: not this change's
    same = _run(_process("./perf test", [o for o in GOOD if o is not GOOD[2]], 4, alone))
    assert against(same, [_run(_process("./perf test", GOOD, 4))], "good.json") == []
    assert same.processes[0].groups[0].verdict is alone


def test_a_baseline_without_operation_counts_is_said() -> None:
    bad = _run(_process("./perf test", GOOD, 4, Verdict(UNKNOWN, "x")))
    old = _run(_process("./perf test", []))
    (note,) = against(bad, [old], "old.json")
    assert note.startswith("old.json: 1 of 1 runs have no operation counts"), note
    assert bad.processes[0].groups[0].verdict == Verdict(UNKNOWN, "x")


def test_another_types_put_further_out_made_the_call() -> None:
    """A thread's maps put as thread__put tears the thread down: thread__put made the
    call (in a teardown), not the function that put the thread."""
    teardown = op(Role.PUT, "maps__put maps__put thread__put machine__exit main")
    assert call_site(teardown) == 2
    assert changes([teardown], [])[0].nested


def _leaked_dso_chain() -> tuple[dict[str, list[PathOp]], dict[str, list[PathOp]]]:
    """perf's map__exit forgets its dso's put (a destructor: a teardown change with
    no other cause); the leaked dsos then no longer run dso__delete, which put
    their nsinfo: the nsinfo's lost puts are the dso's consequence."""
    good = {"dso": GOOD,
            "nsinfo": [op(Role.INIT, "nsinfo__new dso__new main", 8),
                       op(Role.PUT, "nsinfo__put dso__delete dso__put main", 8)]}
    bad = {"dso": [o for o in GOOD if o is not GOOD[2]],
           "nsinfo": [good["nsinfo"][0], op(Role.PUT, "nsinfo__put dso__delete dso__put main",
                                             4)]}
    return good, bad


def test_a_teardown_of_a_leaked_type_points_at_that_types_culprit() -> None:
    good, bad = _leaked_dso_chain()
    result = _run(ProcessReport(1, "perf", ["./perf"], "exited", groups=[
        LeakGroup(t, (Frame("perf", 1, f"{t}__new"),), [LeakedObject(0x100, 1, 1, 0, 0)],
                  verdict=Verdict(UNKNOWN, "alone")) for t in ("dso", "nsinfo")],
        operations=bad))
    against(result, [_run(ProcessReport(1, "perf", ["./perf"], "exited", operations=good))],
            "good.json")
    dso, nsinfo = result.processes[0].groups
    assert dso.culprits[0].function.function == "map__exit"
    assert nsinfo.culprits[0].function.function == "map__exit"
    assert nsinfo.culprits[0].why.startswith(
        "the nsinfo puts lost are in a teardown (dso__delete) that leaked dso objects no "
        "longer run: map__exit made 4 puts fewer"), nsinfo.culprits[0].why


def test_an_undecided_comparison_does_not_keep_the_runs_own_guess() -> None:
    """Against the good run, two functions kept more: the run alone named one of
    them with confidence (on the benchmark such guesses were wrong); the verdict is
    unknown, naming both, and says what the run alone said."""
    from refcntd.analysis.attribution import FOUND
    from refcntd.analysis.pathops import MISSING_PUT, Culprit
    guess = Verdict(FOUND, "", [Culprit(MISSING_PUT, Frame("perf", 1, "map__new2"), ())])
    bad = [o for o in GOOD if o is not GOOD[4]] + [op(Role.PUT, "dso__put load_all main", 3),
                                                   op(Role.GET, "dso__get map__new2 main", 1)]
    result = _run(_process("./perf test", bad, 4, guess))
    against(result, [_run(_process("./perf test", GOOD))], "good.json")
    (group,) = result.processes[0].groups
    assert group.verdict is not None and group.verdict.status == UNKNOWN
    assert group.culprits == []
    assert "by 2 functions (load_all +1, map__new2 +1)" in group.verdict.reason
    assert group.verdict.notes == ("without good.json: missing put in map__new2",)


def test_held_groups_follow_their_holder_unless_their_own_type_changed() -> None:
    """A forgotten map__put in main leaks maps, and their dsos indirectly: the dso
    group stays indirect and names the map's culprit; a group the run alone took
    for held, whose own type lost puts outside any teardown, is judged itself."""
    from refcntd.analysis.model import Holder
    from refcntd.analysis.ownership import INDIRECT
    good = {"map": [op(Role.INIT, "map__new2 main", 4), op(Role.PUT, "map__put main", 4)],
            "dso": GOOD}
    bad = {"map": [good["map"][0]], "dso": [o for o in GOOD if o is not GOOD[2]]}
    held = LeakedObject(0x100, 1, 1, 0, 0, held_by=(Holder(0x200, "map", 1, ()),))
    dso = LeakGroup("dso", (Frame("perf", 1, "dso__new"),), [held],
                    verdict=Verdict(INDIRECT, "held only by leaked 'map' 0x200"))
    maps = LeakGroup("map", (Frame("perf", 1, "map__new2"),), [LeakedObject(0x200, 1, 0, 0, 0)],
                     verdict=Verdict(INDIRECT, "held by a thread, it seemed"))
    result = _run(ProcessReport(1, "perf", ["./perf"], "exited", groups=[dso, maps],
                                operations=bad))
    against(result, [_run(ProcessReport(1, "perf", ["./perf"], "exited", operations=good))],
            "good.json")
    assert maps.verdict is not None and maps.verdict.status == "culprit"
    assert maps.culprits[0].function.function == "main"
    assert dso.verdict is not None and dso.verdict.status == INDIRECT
    assert [(c.function.function, c.holder) for c in dso.culprits] == [("main", "map 0x200")]


def test_what_two_runs_of_the_same_work_move_cancels_out() -> None:
    """GStreamer's sinks made 3 more latency queries in one run than in the other:
    created in one function, put in another.  Beside a function that lost 18 puts,
    that is no second suspect; beside one that lost 1, it is."""
    good = [op(Role.GET, "dso__get load_all main", 18), op(Role.PUT, "dso__put load_all main", 18)]
    noise = [op(Role.GET, "dso__get query_latency main", 3),
             op(Role.PUT, "dso__put sink_query main", 3)]
    found = regression("dso", [good], [good[0], *noise], "good.json")
    assert found.culprit is not None and found.culprit.function.function == "load_all", found
    lost_one = [good[0], op(Role.PUT, "dso__put load_all main", 17), *noise]
    assert regression("dso", [good], lost_one, "good.json").culprit is None


def test_what_differs_between_good_runs_is_noise() -> None:
    """One good run of GStreamer's pipeline set 4 fewer GValues than the other; the
    changed run is like the other there.  Against both, only the lost put is a change."""
    good = [op(Role.GET, "dso__get load_all main", 2), op(Role.PUT, "dso__put load_all main", 2)]
    values = op(Role.GET, "dso__get g_value_set_object iterate main", 4)
    bad = [good[0], values]
    assert regression("dso", [good], bad, "a.json").culprit is None  # +4 beside +2
    found = regression("dso", [good, [*good, values]], bad, "a.json and b.json")
    assert found.culprit is not None and found.culprit.function.function == "load_all", found
    assert "2 puts fewer" in found.culprit.why


def test_a_change_in_code_without_a_symbol_names_no_function() -> None:
    """GStreamer's task thread lost puts in a frame no symbol covers: no name to give."""
    unnamed = PathOp(Role.PUT, (Frame("libgst.so", 0x10, "gst_object_unref"),
                                Frame("libgst.so", 0x2000)), 3)
    good = [op(Role.GET, "dso__get load_all main", 3), unnamed]
    found = regression("dso", [good], good[:1], "a.json")
    assert found.culprit is None and "code without a symbol" in found.reason, found
