"""Ownership patterns of perf's real code that the inference got wrong (issue 31,
benchmarks/mutants), each as a small -O2 program without frame pointers.

mapowner.c: a constructor wrapper (dso__new_map) that makes a child and an
owner holding it, and returns the owner: a forgotten put of the owner leaks it
directly and the child indirectly, not the other way round (the code before
saw a cycle).  The map's last put runs map__delete, which calls the delete
stub, as perf's does: that must not hide map__put as the put wrapper.
mapexit.c: a destructor forgets a child's put; stash.c: a cleanup forgets the
puts of references a callee stashed in a global.  Both leave the leftover get
in a function that did nothing wrong, and the verdict says what it saw.
"""

from __future__ import annotations

from pathlib import Path

from conftest import Build, hostile_history, leak_summary


def _by_type(process: dict) -> dict[str, dict]:
    return {g["type"]: g for g in process["groups"]}


def test_an_owner_made_by_a_constructor_wrapper_holds_its_child(
        bpf: None, build: Build, tmp_path: Path) -> None:
    process = hostile_history(build, tmp_path, "mapowner")
    assert leak_summary(process) == {"dso": [1], "map": [1]}
    groups = _by_type(process)
    owner, child = groups["map"], groups["dso"]
    assert owner["verdict"]["status"] == "culprit", owner["verdict"]
    top = owner["culprits"][0]
    assert (top["kind"], top["function"]) == ("missing put", "main"), top
    assert child["verdict"]["status"] == "indirect", child["verdict"]
    assert "held only by leaked 'map'" in child["verdict"]["reason"], child["verdict"]


def test_a_reference_stored_in_an_owner_is_not_blamed_on_the_constructor(
        bpf: None, build: Build, tmp_path: Path) -> None:
    """mapexit.c: map__exit forgets the dso's put.  The only leftover get is map__new2's,
    which stored it in a map (released since): the put is missing where that map
    went, which no dso path shows.  The code before said "missing put map__new2"."""
    process = hostile_history(build, tmp_path, "mapexit")
    assert leak_summary(process) == {"dso": [1] * 4}
    (group,) = process["groups"]
    verdict = group["verdict"]
    assert (verdict["status"], group["culprits"]) == ("unknown", []), verdict
    assert ("map__new2 stored the reference in a map it builds or fills (no released "
            "object got a reference at this path): the put is likely missing where that "
            "map is destroyed or the reference removed") in verdict["reason"], verdict


def test_a_reference_stashed_by_a_callee_is_not_blamed_on_its_caller(
        bpf: None, build: Build, tmp_path: Path) -> None:
    """stash.c: put_saved forgets the global slots' puts.  The leftover gets were made
    in add_entries, which no released object went through; only the leaked objects'
    own pairs make it look like it hands references up.  The code before named the
    test function that called it."""
    process = hostile_history(build, tmp_path, "stash")
    assert leak_summary(process) == {"dso": [1] * 4}  # the samples' dsos
    (group,) = process["groups"]
    verdict = group["verdict"]
    assert (verdict["status"], group["culprits"]) == ("unknown", []), verdict
    assert ("kept a reference got through add_entries, and no released object "
            "shows add_entries handing references up: add_entries may have stored it"
            ) in verdict["reason"], verdict
