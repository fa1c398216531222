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


def test_a_finding_seen_lost_in_one_process_fails():
    result = run(proc(1, "exit 0", group("still reachable")),
                 proc(2, "exit 0", group("indirectly lost")))
    assert sorted(statuses(Policy(lsan=True), result)) == [FAILING, REACHABLE]
