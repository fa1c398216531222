"""A reference stored in a long-lived owner is paired with the owner's put
(issue 31: perf's kernel-dso leak).

ownerstore.c (-O2, no frame pointers) gets a dso four ways; three of its puts
come at teardown, so every get and every put of the leaked dso share only
main.  Pairing by the deepest shared caller alone cannot tell them apart; the
owner's API on both paths can: the map__new2 reference goes with map__delete's
put, the dsos__add one with dsos__exit's, and what is left is the reference
dsos__findnew handed to process_kernel_mmap, which never put it.
"""

from __future__ import annotations

from pathlib import Path

from conftest import Build, hostile_history, leak_summary


def test_the_reference_handed_up_is_the_leak_not_the_stored_ones(
        bpf: None, build: Build, tmp_path: Path) -> None:
    process = hostile_history(build, tmp_path, "ownerstore")
    assert leak_summary(process) == {"dso": [1]}  # every map was released
    (group,) = process["groups"]
    assert group["verdict"]["status"] == "culprit", group["verdict"]
    top = group["culprits"][0]
    assert (top["kind"], top["function"]) == ("missing put", "process_kernel_mmap")
    # the culprit's path is the handed-up reference's: dso__get < dsos__findnew < it
    assert [f["function"] for f in top["stack"][:3]] == \
        ["dso__get", "dsos__findnew", "process_kernel_mmap"]
