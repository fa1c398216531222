"""Culprits on ordinary patterns (issue 15): ownership between objects, direct and
indirect leaks, cycles, hand-overs, caches, hundreds of paths, honest ties.

Real BPF on C fixtures built -O2 -fomit-frame-pointer (the CFI unwinder walks
them); one refcntd run per fixture, several independent scenarios per run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import FIXTURES, Build, refcntd

Group = dict[str, Any]


def run(build: Build, tmp_path: Path, name: str, *args: str) -> tuple[dict[str, Any], str]:
    exe = build.program(name, [FIXTURES / f"{name}.c"], "O2", flags=["-fomit-frame-pointer"])
    result = refcntd(["run", "--history", "--", str(exe), *args], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    assert "nothing lost" in result.stderr, result.stderr
    (process,) = result.report["processes"]
    return process, result.stderr


def by_type(process: dict[str, Any]) -> dict[str, list[Group]]:
    out: dict[str, list[Group]] = {}
    for g in process["groups"]:
        out.setdefault(g["type"], []).append(g)
    return out


def top(group: Group) -> tuple[str, str]:
    first = group["culprits"][0]
    return first["kind"], first["function"]


def test_owners_shared_and_wide(bpf: None, build: Build, tmp_path: Path) -> None:
    """(a) owner holding a child, (d) one object held by two leaked owners,
    (f) one unpaired get among 210 balanced get/put paths."""
    process, text = run(build, tmp_path, "owners")
    groups = by_type(process)
    assert sorted(groups) == ["child", "holder", "owner", "shared", "wide"]
    # (a) the owner is a direct leak: main's scenario forgot owner_put
    (owner,) = groups["owner"]
    assert owner["verdict"]["status"] == "culprit"
    assert top(owner) == ("missing put", "scenario_owner")
    assert [f["function"] for f in owner["culprits"][0]["expected_stack"][:2]] == \
        ["owner_put", "scenario_owner"]
    (child,) = groups["child"]
    (inst,) = child["instances"]
    assert inst["leak"] == "indirect"
    assert [h["type"] for h in inst["held_by"]] == ["owner"]
    assert [f["function"] for f in inst["held_by"][0]["stack"][:2]] == ["child_get", "owner_new"]
    assert child["verdict"]["status"] == "indirect"
    assert top(child) == ("missing put", "scenario_owner")
    assert child["culprits"][0]["holder"].startswith("owner 0x")
    # (d) two direct holders, one shared object held by both
    assert [top(g) for g in groups["holder"]] == [("missing put", "scenario_shared")] * 2
    assert all(i["leak"] == "direct" for g in groups["holder"] for i in g["instances"])
    (shared,) = groups["shared"]
    (inst,) = shared["instances"]
    assert (inst["count"], inst["leak"]) == (2, "indirect")
    holders = {h["address"] for h in inst["held_by"]}
    assert holders == {g["instances"][0]["address"] for g in groups["holder"]}
    # (f) exact among many paths
    (wide,) = groups["wide"]
    (inst,) = wide["instances"]
    assert (inst["count"], inst["gets"], inst["puts"]) == (1, 211, 211)
    assert wide["verdict"]["notes"] == []  # the per-path counts add up to every get and put
    assert (wide["culprits"][0]["objects"], wide["culprits"][0]["references"]) == (1, 1)
    assert wide["verdict"]["status"] == "culprit"
    assert top(wide) == ("missing put", "use_bad")
    assert [f["function"] for f in wide["culprits"][0]["stack"]] == ["wide_get", "use_bad"]
    assert process["cycles"] == []
    assert "Indirectly leaked 1 object of type 'child'" in text
    assert "fixing this leak fixes them" in text


def test_handover_consumer_path(bpf: None, build: Build, tmp_path: Path) -> None:
    """(b) produce() gets, consume() puts; finish_slow() forgets."""
    process, text = run(build, tmp_path, "handover")
    (msg,) = process["groups"]
    assert msg["verdict"]["status"] == "culprit"
    assert top(msg) == ("missing put", "finish_slow")
    assert [f["function"] for f in msg["culprits"][0]["expected_stack"][:2]] == \
        ["msg_put", "finish_fast"]
    assert "Likely culprit: missing put in finish_slow" in text


def test_ambiguous_is_a_tie(bpf: None, build: Build, tmp_path: Path) -> None:
    """(g) main hands message 5 to two peekers that both return: no evidence tells
    which of them (or main) should have put it: a tie, never one confident name."""
    process, text = run(build, tmp_path, "handover", "peek")
    (msg,) = process["groups"]
    assert msg["verdict"]["status"] == "tie"
    assert sorted(c["function"] for c in msg["culprits"]) == ["peek_x", "peek_y"]
    assert all(sorted(c["tie"]) == ["peek_x", "peek_y"] for c in msg["culprits"])
    assert "Culprit tie: 2 functions have the same evidence: peek_x, peek_y" in text
    assert "Likely culprit" not in text


def test_cache_eviction_path(bpf: None, build: Build, tmp_path: Path) -> None:
    """(c) insert and lookup each take a reference; evict_full() forgets its put."""
    process, _ = run(build, tmp_path, "cache")
    (entry,) = process["groups"]
    assert [i["count"] for i in entry["instances"]] == [1]
    assert top(entry) == ("missing put", "evict_full")
    assert [f["function"] for f in entry["culprits"][0]["stack"][:2]] == \
        ["entry_get", "cache_insert"]


def test_cycle_of_two(bpf: None, build: Build, tmp_path: Path) -> None:
    """(e) a holds b, b's constructor took a reference to a: one cycle."""
    process, text = run(build, tmp_path, "cycle")
    groups = by_type(process)
    assert sorted(groups) == ["a", "b"]
    addrs = sorted(g["instances"][0]["address"] for gs in groups.values() for g in gs)
    assert process["cycles"] == [addrs]
    for (g,) in groups.values():
        assert g["verdict"]["status"] == "cycle"
        assert g["instances"][0]["leak"] == "cycle"
        assert g["instances"][0]["cycle"] == addrs
    assert "Leak cycle: they hold each other" in text
