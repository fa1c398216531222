"""Holders at exit (refcntd/reach/holders.py): every slot pointing to a leaked object,
and the references no slot holds, on a real -O2 program held at `_exit` by the real
uprobe and scanned; truth by construction (tests/fixtures/holders.c)."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd

UNHELD = "reference held by nothing"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    out = tmp_path_factory.mktemp("holders")
    return cc(out / "holders", [FIXTURES / "holders.c", EXAMPLES / "refcnt.c"],
              ["-O2", "-fomit-frame-pointer"])


def printed(stdout: str, tag: str) -> dict[str, int]:
    return {m[1]: int(m[2], 16) for m in re.finditer(rf"^{tag} (\w+) (0x[0-9a-f]+)$", stdout,
                                                     re.M)}


@pytest.fixture(scope="module")
def result(bpf, program, tmp_path_factory):
    return refcntd(["run", "--", str(program)],
                   tmp_path_factory.mktemp("holders-run") / "r.json")


def objects(result) -> dict[int, tuple[dict, dict]]:
    (process,) = result.report["processes"]
    return {int(i["address"], 16): (g, i) for g in process["groups"] for i in g["instances"]}


def test_holders_and_unheld_references(result):
    names = printed(result.stdout, "OBJ")
    slots = printed(result.stdout, "SLOT")
    found = objects(result)
    assert set(found) == set(names.values()), result.stderr
    by_name = {n: found[a][1] for n, a in names.items()}
    expected = {  # name: (kind, holders, unheld)
        "kept": ("still reachable", 1, 0), "extra_ref": (UNHELD, 1, 1),
        "tree_root": ("still reachable", 2, 0), "tree_child": ("still reachable", 1, 0),
        "purged_live": ("still reachable", 1, 0), "purged": (UNHELD, 0, 1),
        "listed": ("still reachable", 2, 0), "self_held": ("still reachable", 2, 0),
        "lost": ("definitely lost", 0, 1)}
    got = {n: (i["kind"], i["holders"], i["unheld"]) for n, i in by_name.items()}
    assert got == expected, result.stderr
    holder = {n: [p for p in i["pointers"] if p["counted"]] for n, i in by_name.items()}
    assert [p["holder"] for p in holder["kept"]] == ["global kept_ptr (holders)"]
    assert int(holder["kept"][0]["slot"], 16) == slots["kept_ptr"]
    assert [p["holder"] for p in holder["extra_ref"]] == ["global extra_ptr (holders)"]
    # the root: the global rb_root and its child's parent link, both into its node
    child_at = names["tree_child"]
    assert sorted((p["holder"], p["interior"]) for p in holder["tree_root"]) == \
        [("global tree (holders)", True), (f"tree_child 0x{child_at:x}+0x8", True)]
    # the child is held by a link inside tree_root: named after that object and member
    (child,) = holder["tree_child"]
    root = names["tree_root"]
    assert child["holder"] == f"tree_root 0x{root:x}+0x{slots['child_link'] - root:x}"
    assert child["interior"] and int(child["slot"], 16) == slots["child_link"]
    # perf's stale tree link: listed, not counted, with the reason
    stale, own = sorted(by_name["purged"]["pointers"], key=lambda p: "own" in p["why"])
    assert not own["counted"] and own["why"] == "a link of its own memory"
    live = names["purged_live"]
    assert not stale["counted"] and "cleared node" in stale["why"]
    assert stale["holder"] == f"purged_live 0x{live:x}+0x{slots['stale_link'] - live:x}"
    assert sorted(p["holder"] for p in holder["self_held"]) == [
        "global self_ptr (holders)", f"self_held 0x{names['self_held']:x}+0x20"]
    assert by_name["lost"]["pointers"] == []


def test_unheld_references_fail_and_are_named_in_the_text(result):
    """The two unheld references are failing findings of their own, with the lost
    object; the reachable ones that every reference holds do not fail."""
    assert result.returncode == 23, result.stderr
    assert "3 failing finding(s)" in result.stderr, result.stderr
    purged = printed(result.stdout, "OBJ")["purged"]
    text = result.stderr
    at = text.index(f"object 0x{purged:x}")
    block = text[at:at + 600]
    assert "1 reference held by nothing: count 1, no holder" in block, block
    assert "not a holder: purged_live 0x" in block and "cleared node" in block, block
    assert "Leaked (reference held by nothing) 1 object of type 'extra_ref'" in text
