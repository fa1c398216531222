"""--history: per-object get/put stacks, bounds, and culprit attribution (real BPF).

perflike's run uses --no-leak-kinds: leak kinds split its leaked maps into a
definitely and an indirectly lost group where the test reads one group per caller.
masami's and manygets' runs judge with leak kinds, the default.
"""

from __future__ import annotations

import pytest
from conftest import FIXTURES, assert_probe_mode, functions, refcntd

PERFLIKE_RUN = ["run", "--no-leak-kinds"]  # the module docstring says why


def group_by_allocator(process: dict) -> dict[str, dict]:
    """Leak groups keyed by the function two frames above the stub (make_b, make_c...)."""
    return {functions(g)[2]: g for g in process["groups"]}


@pytest.mark.parametrize("variant", ["O0", "O2"])
def test_masami_missing_put_and_extra_get(bpf, build, tmp_path, variant, probe_mode):
    exe = build.program("masami", [FIXTURES / "masami.c"], variant)
    result = refcntd(["run", "--history", "--", str(exe)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert_probe_mode(result.report, probe_mode)
    (process,) = result.report["processes"]
    groups = group_by_allocator(process)
    assert sorted(groups) == ["make_b", "make_c"]  # the make_d objects were released
    b = groups["make_b"]["culprits"][0]
    assert (b["kind"], b["function"]) == ("missing put", "funcB")
    assert [f["function"] for f in b["stack"]] == ["funcA", "funcB"]
    assert (b["objects"], b["references"], b["released_uses"]) == (1, 1, 0)
    c = groups["make_c"]["culprits"][0]
    assert (c["kind"], c["function"]) == ("extra get", "funcC")
    assert [f["function"] for f in c["stack"]] == ["funcC"]  # funcC's own get, not funcA's
    assert "Likely culprit: missing put in funcB" in result.stderr
    assert "Likely culprit: extra get in funcC" in result.stderr


def test_perflike_caller_that_forgets_its_put(bpf, build, tmp_path, probe_mode):
    """thread__find_map's map__get is put by sample__resolve_user, not by ..._kernel."""
    exe = build.perflike("O2fp")
    result = refcntd([*PERFLIKE_RUN, "--history", "map", "--", str(exe)], tmp_path / "r.json")
    assert_probe_mode(result.report, probe_mode)
    (process,) = result.report["processes"]
    (kernel_maps,) = [g for g in process["groups"]
                      if "machine__create_kernel_maps" in functions(g)]
    first = kernel_maps["culprits"][0]
    assert (first["kind"], first["function"]) == ("missing put", "sample__resolve_kernel")
    names = [f["function"] for f in first["stack"]]  # thread__find_map tail-calls map__get
    assert names[0] == "map__get" and names[-1] == "sample__resolve_kernel", names
    assert (first["objects"], first["references"], first["released_uses"]) == (1, 10, 0)
    # history was only kept for the type asked for
    others = [g for g in process["groups"] if g["type"] != "map"]
    assert others and all("history" not in i for g in others for i in g["instances"])
    history = [i for i in kernel_maps["instances"] if i["count"] == 10][0]["history"]
    assert [s["op"] for s in history] == ["init"] + ["get"] * 10 + ["put"]
    assert [s["count_after"] for s in history] == [1, *range(2, 12), 10]
    assert all(a["at_ns"] <= b["at_ns"] for a, b in zip(history, history[1:], strict=False))


def test_history_is_bounded_per_object(bpf, build, tmp_path):
    exe = build.program("manygets", [FIXTURES / "manygets.c"], "O0")
    result = refcntd(["run", "--history", "--history-depth", "16", "--", str(exe), "100000"],
                     tmp_path / "r.json", timeout=300)
    (process,) = result.report["processes"]
    (group,) = process["groups"]
    (obj,) = group["instances"]
    assert obj["count"] == 100001 and obj["gets"] == 100000
    assert obj["history_total"] == 100001
    assert len(obj["history"]) == 16 and obj["history_dropped"] == 99985
    assert "history: 16 of 100001 operations, 99985 later ones dropped (bound 16 per object)" \
        in result.stderr
    (culprit,) = group["culprits"]  # site counts stay exact beyond the kept events
    assert culprit["references"] == 100001


