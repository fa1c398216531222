"""The analysis cache: a second analysis of the same binary does no DWARF work;
stale and corrupt entries are rebuilt, never trusted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bigsource  # noqa: E402

from refcntd.binary import analysiscache, dwarfinfo, plan  # noqa: E402
from refcntd.cli.check import render_check  # noqa: E402
from refcntd.inputs.spec import load_spec  # noqa: E402


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bigsource.build(tmp_path_factory.mktemp("big"), bigsource.SMOKE)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(analysiscache, "CACHE_DIR", tmp_path)
    return tmp_path


def _no_dwarf(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kw: object) -> None:
        raise AssertionError("DWARF work on a warm cache")
    monkeypatch.setattr(dwarfinfo, "inlined_copies", refuse)
    monkeypatch.setattr(dwarfinfo, "clone_argument_registers", refuse)


def _check(program: Path) -> str:
    return render_check(plan.build_plan(load_spec("example-objapi"), str(program)))


def test_second_analysis_does_no_dwarf_work(program: Path, cache: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cold = _check(program)
    assert "dwarf answers: computed" in cold
    assert len(list((cache / "analysis").glob("*.json"))) == 1
    _no_dwarf(monkeypatch)
    warm = _check(program)
    assert "dwarf answers: from the analysis cache" in warm
    assert warm.replace("from the analysis cache", "computed") == cold
    assert "obj_get was inlined at 3 call site(s)" in warm
    assert "constprop clone of obj_get, arguments placed by DWARF" in warm


@pytest.mark.parametrize("damage", ["truncated", "garbage", "edited body", "other version",
                                    "other spec"])
def test_bad_entries_are_rebuilt(program: Path, cache: Path, damage: str) -> None:
    cold = _check(program)
    entry = next((cache / "analysis").glob("*.json"))
    text = entry.read_text()
    data = json.loads(text)
    if damage == "truncated":
        entry.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\0\xff" * 100)
    elif damage == "edited body":  # a wrong answer with a stale digest
        data["body"]["inlined"]["obj_get,obj_init,obj_put"]["copies"][0][1] = 99
        entry.write_text(json.dumps(data))
    else:
        data["key"]["refcntd" if damage == "other version" else "spec"] = "x"
        entry.write_text(json.dumps(data))
    again = _check(program)
    assert "dwarf answers: computed" in again and again == cold
    rebuilt = json.loads(entry.read_text())
    assert rebuilt["key"]["refcntd"] != "x" and rebuilt["key"]["spec"] != "x"
    assert "dwarf answers: from the analysis cache" in _check(program)


def test_dwarf_scan_in_a_child_gives_the_same_answers(program: Path, cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The inlined-copy scan forked beside the call-site sweep (here whatever the size
    of the DWARF, on two CPUs) answers as the scan in this process; a child that fails
    (its answer cannot be pickled) costs time, not answers."""
    from refcntd.binary import cpus, forked
    monkeypatch.setattr(analysiscache, "FORK_SCAN_BYTES", 0)
    monkeypatch.setattr(cpus, "free", lambda: 2)
    started: list[int] = []
    real_fork = forked.os.fork

    def counted() -> int:
        pid = real_fork()
        if pid:
            started.append(pid)
        return pid
    monkeypatch.setattr(forked.os, "fork", counted)
    in_child = _check(program)
    assert len(started) == 1 and "obj_get was inlined at 3 call site(s)" in in_child
    for entry in (cache / "analysis").glob("*.json"):
        entry.unlink()
    monkeypatch.setattr(analysiscache, "FORK_SCAN_BYTES", 1 << 60)
    assert _check(program) == in_child  # no child: the same text
    for entry in (cache / "analysis").glob("*.json"):
        entry.unlink()
    monkeypatch.setattr(analysiscache, "FORK_SCAN_BYTES", 0)

    def broken(*_args: object, **_kw: object) -> bytes:
        raise RuntimeError("no")
    monkeypatch.setattr(forked.pickle, "dumps", broken)
    assert _check(program) == in_child and len(started) == 2
