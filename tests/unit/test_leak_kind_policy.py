"""LeakSanitizer's policy with --leak-kinds (outputs/policy.py) and the split of leak
groups by kind (analysis/kinds.py)."""

from __future__ import annotations

from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.outputs.policy import FAILING, NOT_JUDGED, REACHABLE, Policy


def group(kind: str, n: int = 1) -> LeakGroup:
    return LeakGroup("obj", (), [LeakedObject(0x10 * i, 1, 0, 0, 0, kind=kind)
                                 for i in range(n)], kind=kind)


def run(*processes: ProcessReport) -> RunResult:
    return RunResult("run", "perf-stubs", "t", list(processes))


def proc(pid: int, status: str, *groups: LeakGroup) -> ProcessReport:
    return ProcessReport(pid, "p", ["p"], "exited", status, 0, list(groups))


def statuses(policy: Policy, result: RunResult) -> list[str]:
    return [f.status for f in policy.evaluate(result).findings]


def test_reachable_is_listed_apart_and_not_failing():
    result = run(proc(1, "exit 0", group("still reachable"), group("definitely lost")))
    assert sorted(statuses(Policy(lsan=True), result)) == [FAILING, REACHABLE]
    assert statuses(Policy(lsan=True, fail_on_reachable=True), result) == [FAILING, FAILING]
    assert statuses(Policy(), result) == [FAILING, FAILING]  # without --leak-kinds


def test_killed_processes_are_not_judged_unless_asked():
    result = run(proc(1, "killed by SIGTERM", group("")))
    assert statuses(Policy(lsan=True), result) == [NOT_JUDGED]
    assert statuses(Policy(lsan=True, judge_killed=True), result) == [FAILING]


def test_processes_ended_by_a_direct_exit_are_not_judged_unless_asked():
    direct = proc(1, "exit 1", group("definitely lost"))
    direct.direct_exit = True
    (finding,) = Policy(lsan=True).evaluate(run(direct)).findings
    assert finding.status == NOT_JUDGED and "_exit without exit()" in finding.reason
    assert statuses(Policy(lsan=True, judge_killed=True), run(direct)) == [FAILING]
    assert statuses(Policy(), run(direct)) == [FAILING]  # without --leak-kinds
    # the same finding in a process that ran exit() fails
    assert statuses(Policy(lsan=True), run(direct, proc(2, "exit 1", group("definitely lost")))) \
        == [FAILING]


def test_a_finding_seen_lost_in_one_process_fails():
    result = run(proc(1, "exit 0", group("still reachable")),
                 proc(2, "exit 0", group("indirectly lost")))
    assert sorted(statuses(Policy(lsan=True), result)) == [FAILING, REACHABLE]


def test_objects_sharing_a_block_get_no_kind():
    """A slab (GSlice) is reachable while any object in it is: no kind for its objects;
    one object inside its block (GLib's private data first) keeps the block's."""
    import numpy as np

    from refcntd.analysis.kinds import apply_kinds
    from refcntd.reach import glibc, graph
    from refcntd.reach.roots import Root
    from refcntd.reach.scan import ReachScan

    scan = ReachScan(1, heap=glibc.Heap(np.array([0x1000], np.uint64),
                                       np.array([0x1100], np.uint64)),
                     kinds=graph.Kinds(np.array([graph.REACHABLE], np.int8),
                                       np.array([0]), np.array([0x10], np.uint64),
                                       np.array([-1])),
                     roots=[Root(0, 0x100, "mapping", "0x0-0x100")])
    alone = LeakGroup("obj", (), [LeakedObject(0x1040, 1, 0, 0, 0)])
    (out,) = apply_kinds([alone], scan)
    assert out.kind == "still reachable" and out.objects[0].root == "the mapping 0x0-0x100"
    g = LeakGroup("obj", (), [LeakedObject(0x1000, 1, 0, 0, 0), LeakedObject(0x1040, 1, 0, 0, 0)])
    (out,) = apply_kinds([g], scan)
    assert out.kind == "" and len(out.objects) == 2
    assert "2 object(s) sharing a malloc block" in scan.notes[-1]


def test_objects_in_freed_chunks_are_said():
    """An object whose memory malloc holds as free (its delete went unseen) gets no kind
    and a note with the count, not silence; one outside every chunk gets neither."""
    import numpy as np

    from refcntd.analysis.kinds import apply_kinds
    from refcntd.reach import glibc, graph
    from refcntd.reach.scan import ReachScan

    heap = glibc.Heap(np.array([0x1000], np.uint64), np.array([0x1100], np.uint64))
    heap.freed, heap.freed_ends = np.array([0x2000], np.uint64), np.array([0x2040], np.uint64)
    scan = ReachScan(1, heap=heap, kinds=graph.Kinds(np.array([graph.UNREACHED], np.int8),
                                                     np.array([-1]), np.array([0], np.uint64),
                                                     np.array([-1])))
    g = LeakGroup("obj", (), [LeakedObject(a, 1, 0, 0, 0) for a in (0x1000, 0x2010, 0x3000)])
    out = apply_kinds([g], scan)
    assert sorted((x.kind, len(x.objects)) for x in out) == [("", 2), ("definitely lost", 1)]
    assert scan.notes == ["1 object(s) in malloc chunks free at the scan (their memory was "
                          "released, their delete not seen): no kind, a leak as without "
                          "leak kinds"]


def test_objects_created_after_the_scan_are_late_and_not_judged():
    """At exit, threads run on between the scan and exit_group: an object they create
    then (its age younger than the scan) sits where the scan saw free memory or another
    block.  It gets the kind LATE, a note, and its finding is not judged; an older object
    at a free chunk keeps the freed note."""
    import numpy as np

    from refcntd.analysis.kinds import apply_kinds
    from refcntd.reach import glibc, graph
    from refcntd.reach.scan import LATE, ReachScan

    heap = glibc.Heap(np.array([0x1000], np.uint64), np.array([0x1100], np.uint64))
    heap.freed, heap.freed_ends = np.array([0x2000], np.uint64), np.array([0x2040], np.uint64)
    scan = ReachScan(1, heap=heap, taken_ns=1_000, kinds=graph.Kinds(
        np.array([graph.UNREACHED], np.int8), np.array([-1]), np.array([0], np.uint64),
        np.array([-1])))
    now = 5_000  # the exit event: ages are counted back from it
    g = LeakGroup("obj", (), [LeakedObject(0x1000, 1, 0, 0, 3_000),  # created 2_000: late
                              LeakedObject(0x2010, 1, 0, 0, 3_000),  # late, at a free chunk
                              LeakedObject(0x2020, 1, 0, 0, 4_500)])  # 500: freed unseen
    out = apply_kinds([g], scan, now)
    assert sorted((x.kind, len(x.objects)) for x in out) == [("", 1), (LATE, 2)]
    assert scan.notes[0].startswith("2 object(s) created after the scan")
    assert scan.notes[1].startswith("1 object(s) in malloc chunks free at the scan")
    result = run(proc(1, "exit 0", *[x for x in out if x.kind == LATE]))
    assert statuses(Policy(lsan=True), result) == [NOT_JUDGED]
    assert statuses(Policy(), result) == [FAILING]  # without --leak-kinds
    assert apply_kinds([g], scan)[0].kind != LATE  # no clock given: no late objects


def test_a_reference_held_by_nothing_fails_apart_from_reachable_objects():
    """The same site's reachable objects pass; its unheld references are a finding of their
    own that fails, also against a baseline where that site was only reachable."""
    from refcntd.analysis.kinds import UNHELD
    from refcntd.outputs.ciformats import case_name, title

    result = run(proc(1, "exit 0", group("still reachable", 3), group(UNHELD)))
    verdict = Policy(lsan=True).evaluate(result)
    by_status = {f.status: f for f in verdict.findings}
    assert sorted(by_status) == [FAILING, REACHABLE]
    unheld = by_status[FAILING]
    assert unheld.unheld and unheld.objects == 1 and unheld.key != by_status[REACHABLE].key
    assert "a reference held by nothing" in title(unheld)
    assert "(reference held by nothing)" in case_name(unheld)
    baseline = Policy(lsan=True, baseline={by_status[REACHABLE].key: (3, 3)})
    assert sorted(statuses(baseline, result)) == [FAILING, "in baseline"]


def test_a_word_pointing_at_itself_holds_nothing():
    """A cleared node at an object's start (perf 6.1's struct map begins with its
    rb_node; RB_CLEAR_NODE points it at itself) is no holder; a pointer to its start
    from elsewhere in its block is (a reference to itself), and from another block too."""
    import numpy as np

    from refcntd.reach import glibc, graph
    from refcntd.reach.holders import LINK_CLEARED, pointers_to
    from refcntd.reach.scan import ReachScan

    u64 = np.uint64
    scan = ReachScan(1, heap=glibc.Heap(np.array([0x1000, 0x2000], u64),
                                       np.array([0x1040, 0x2040], u64)))
    scan.edges = graph.Edges(np.array([0, 0, 1], np.int64), np.array([0, 0, 0], np.int64),
                             np.zeros(3, bool), np.array([0x1000, 0x1020, 0x2008], u64),
                             np.array([0x1000, 0x1000, 0x1000], u64))
    slots = pointers_to(scan, {0x1000})
    assert slots is not None
    assert [(s.where, s.counted, s.not_counted) for s in slots[0x1000]] == [
        (0x1020, True, ""), (0x2008, True, ""), (0x1000, False, LINK_CLEARED)]
