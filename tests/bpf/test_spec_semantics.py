"""Spec semantics on a program of our own (tests/fixtures/semantics.c): an
out-parameter constructor, type names through a class pointer, and a sink
role reading the library's floating flag.  (Delete inside the last put,
frees_at_zero beside a delete role, static_if and may_be_leaked are proven on
the real libraries by test_catalog_*.)"""

from __future__ import annotations

import pytest
from catalog import Outcome, assert_balanced, assert_exact_leaks
from conftest import FIXTURES, cc, refcntd

SPEC = str(FIXTURES / "semantics.yaml")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return cc(tmp_path_factory.mktemp("sem") / "semantics", [FIXTURES / "semantics.c"],
              ["-O2", "-fomit-frame-pointer"])


def run(tmp_path, exe, variant: str) -> Outcome:
    result = refcntd(["run", "--spec", SPEC, "--", str(exe), variant], tmp_path / "r.json")
    (process,) = result.report["processes"]
    truth = {(w[1], int(w[2], 16)): int(w[3]) for w in
             (line.split() for line in result.stdout.splitlines()) if w[:1] == ["leak"]}
    leaks = {(g["type"], int(i["address"], 16)): i["count"]
             for g in process["groups"] for i in g["instances"]}
    return Outcome(result.returncode, truth, [], set(), leaks, process["anomalies"], process,
                   result.report, result.stderr)


def test_balanced(bpf, exe, tmp_path):
    out = run(tmp_path, exe, "balanced")
    assert_balanced(out)
    notes = out.report["tracing"]["notes"]
    assert any("floating references sunk" in n for n in notes)
    assert not [n for n in notes if "never fired" in n], notes
    assert all(p["hits"] > 0 for p in out.report["tracing"]["probes"])


def test_out_parameter_class_type_names_and_floating_sinks_are_exact(bpf, exe, tmp_path):
    out = run(tmp_path, exe, "leak")
    assert_exact_leaks(out)
    assert {t for t, _ in out.leaks} == {"Widget", "Gadget"}  # read via klass->name
