"""Holders at exit (refcntd/reach/holders.py): every slot pointing to a leaked object,
and the references no slot holds, on a real -O2 program held at `_exit` by the real
uprobe and scanned; truth by construction (tests/fixtures/holders.c)."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd, start_hanging

UNHELD = "reference held by nothing"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    out = tmp_path_factory.mktemp("holders")
    return cc(out / "holders", [FIXTURES / "holders.c", EXAMPLES / "refcnt.c"],
              ["-O2", "-fomit-frame-pointer", "-pthread"])


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
        [("global tree (holders)", True), (f"obj 0x{child_at:x} .node.parent", True)]
    # the child is held by a link inside tree_root: named after that object and its
    # member, from the program's DWARF
    (child,) = holder["tree_child"]
    root = names["tree_root"]
    assert child["holder"] == f"obj 0x{root:x} .node.right"
    assert child["interior"] and int(child["slot"], 16) == slots["child_link"]
    # perf's stale tree link: listed, not counted, with the reason
    live, purged = names["purged_live"], names["purged"]
    stale, own = sorted(by_name["purged"]["pointers"],
                        key=lambda p: p["holder"].startswith(f"obj 0x{purged:x}"))
    # its own cleared parent link: a word pointing at itself
    assert not own["counted"] and "cleared node" in own["why"], own
    assert not stale["counted"] and "cleared node" in stale["why"]
    assert stale["holder"] == f"obj 0x{live:x} .node.right"
    assert int(stale["slot"], 16) == slots["stale_link"]
    assert sorted(p["holder"] for p in holder["self_held"]) == [
        "global self_ptr (holders)", f"obj 0x{names['self_held']:x} .self"]
    assert by_name["lost"]["pointers"] == []


def test_unheld_references_fail_and_are_named_in_the_text(result):
    """The two unheld references fail, a finding of their own (one: a finding is keyed by
    type and functions, and both came from build()), beside the lost object's; the
    reachable ones that every reference holds do not fail."""
    assert result.returncode == 23, result.stderr
    assert "2 failing finding(s)" in result.stderr, result.stderr
    assert "(3 leaked, 6 still reachable)" in result.stderr, result.stderr
    purged = printed(result.stdout, "OBJ")["purged"]
    text = result.stderr
    at = text.index(f"object 0x{purged:x}")
    block = text[at:at + 600]
    assert "1 reference held by nothing: count 1, no holder" in block, block
    assert f"not a holder: obj 0x{printed(result.stdout, 'OBJ')['purged_live']:x} .node.right" \
        in block and "cleared node" in block, block
    assert text.count("Leaked (reference held by nothing) 1 object of type 'obj'") == 2


def test_a_stripped_program_names_holders_by_offset(bpf, program, tmp_path):
    """Without DWARF the holder keeps its offset into the object; the holders and the
    verdict are the same."""
    import shutil
    import subprocess

    stripped = tmp_path / "holders-stripped"
    shutil.copy(program, stripped)
    subprocess.run(["strip", "-g", str(stripped)], check=True)
    result = refcntd(["run", "--", str(stripped)], tmp_path / "r.json")
    names = printed(result.stdout, "OBJ")
    slots = printed(result.stdout, "SLOT")
    by_name = {n: objects(result)[a][1] for n, a in names.items()}
    (child,) = [p for p in by_name["tree_child"]["pointers"] if p["counted"]]
    root = names["tree_root"]
    assert child["holder"] == f"obj 0x{root:x}+0x{slots['child_link'] - root:x}"
    assert result.returncode == 23 and "2 failing finding(s)" in result.stderr


def test_live_leaks_name_holders_and_unheld_references(bpf, program, tmp_path):
    """GET /leaks on a process that never exits: the lost object and the two references
    held by nothing, each with its holders, as at exit; nothing every reference holds."""
    import time

    from test_serve import Serve, target_yaml

    with Serve(tmp_path, target_yaml("svc", program)) as serve:
        proc, shown = start_hanging(program)
        try:
            time.sleep(0.5)
            answer = serve.leaks()
        finally:
            proc.kill()
            proc.wait()
        assert serve.stop() == 0
    names = {a: n for n, a in printed(shown, "OBJ").items()}
    (process,) = answer["targets"]["svc"]["run"]["processes"]
    found = {names[int(i["address"], 16)]: (g["kind"], i["holders"], i["unheld"])
             for g in process["groups"] for i in g["instances"]}
    # a stopped process's registers are not read: a count above one holder or more is
    # not judged live (reach/holders.py judged_unheld); none held at all is
    assert found == {"purged": (UNHELD, 0, 1), "lost": ("definitely lost", 0, 1)}, found


def test_with_other_threads_only_objects_with_no_holder_fail(bpf, program, tmp_path):
    """Another thread's callee-saved registers are out of sight: the extra reference may
    be kept there, so it is listed, not judged; the stale-linked object still fails."""
    result = refcntd(["run", "--", str(program), "thread"], tmp_path / "r.json")
    names = printed(result.stdout, "OBJ")
    by_name = {n: objects(result)[a][1] for n, a in names.items()}
    assert (by_name["extra_ref"]["kind"], by_name["extra_ref"]["unheld"]) == \
        ("still reachable", 1)
    assert by_name["purged"]["kind"] == UNHELD
    assert "1 reference held by no slot seen: count 2, 1 holder" in result.stderr
    assert result.returncode == 23 and "2 failing finding(s)" in result.stderr


def test_a_local_is_named_by_its_frame(bpf, program, tmp_path):
    """`local`: an object held only by a volatile local of hold_local(), which calls
    exit(0) itself (-O2, no frame pointer): its holder is the held thread's stack, in the
    frame of hold_local, the slot at the address the program printed; the kind says the
    same frame."""
    result = refcntd(["run", "--", str(program), "local"], tmp_path / "r.json")
    names = printed(result.stdout, "OBJ")
    slots = printed(result.stdout, "SLOT")
    group, on_stack = objects(result)[names["on_stack"]]
    (pid,) = {p["pid"] for p in result.report["processes"]}
    (holder,) = [p for p in on_stack["pointers"] if p["counted"]]
    assert holder["holder"] == f"the stack of thread {pid} (holders) in frame hold_local " \
        "(holders)", holder
    assert int(holder["slot"], 16) == slots["on_stack"]
    assert (on_stack["kind"], on_stack["holders"], on_stack["unheld"]) == \
        ("still reachable", 1, 0), on_stack
    assert "in frame hold_local (holders)" in on_stack["root"], on_stack
