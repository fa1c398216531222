"""Spec roles a run never calls (issue 54, item 4): one note for them all, not a
"check the spec" line per role; counted in the traced processes only, so that the same
library called by another program on the machine (tests run in parallel) does not make
them look used; a command that never maps the probed file audited nothing (issue 39)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    out = tmp_path_factory.mktemp("silent")
    sources = [FIXTURES / "verdicts.c", EXAMPLES / "refcnt.c"]
    return cc(out / "verdicts", sources, ["-O2", "-pthread"])


def silent_notes(report):
    return [n for n in report["tracing"]["notes"] if "fired" in n or "role" in n]


def test_roles_never_called_are_one_note(bpf, exe, tmp_path):
    """`reachable` makes objects and never puts or deletes one (no get is called
    anywhere in the program: call-site probes, none planned for it)."""
    run = refcntd(["run", "--", str(exe), "reachable"], tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    (note,) = silent_notes(run.report)
    assert note.startswith("spec roles never fired in this run (not called"), note
    for role in ("put (__refcnt__put)", "delete (refcnt__delete)"):
        assert role in note, note
    assert "init" not in note and "check the spec" not in run.stderr


def test_calls_by_an_untraced_program_are_not_the_runs(bpf, exe, tmp_path):
    """The same file, run untraced in a loop meanwhile, calls put: the traced run did
    not, and its note says so."""
    busy = subprocess.Popen(["sh", "-c", f"while :; do {exe} anomaly; done"])
    try:
        run = refcntd(["run", "--", str(exe), "reachable"], tmp_path / "r.json")
    finally:
        busy.kill()
        busy.wait()
    (note,) = silent_notes(run.report)
    assert "put (__refcnt__put)" in note, note
    put = [p for p in run.report["tracing"]["probes"] if p["role"] == "put"]
    assert put and all(p["hits"] == 0 for p in put), put


def test_a_command_that_never_maps_the_probed_file_is_incomplete(bpf, exe, tmp_path):
    """Nothing was audited (issue 39's rule, kept): INCOMPLETE, with one note naming the
    file no traced process mapped, and no line per role."""
    spec = tmp_path / "exe.yaml"
    spec.write_text(f"""version: 1
name: verdicts
library: {exe}
roles:
  init: {{functions: [__refcnt__init], object: arg3, type: {{name: obj}}}}
  get: {{functions: [__refcnt__get], object: arg2}}
  put: {{functions: [__refcnt__put], object: arg2}}
""")
    run = refcntd(["run", "--spec", str(spec), "--", "/bin/true"], tmp_path / "r.json")
    assert run.returncode == 24, run.stderr
    assert list(run.report["tracing"]["lost"]) == [
        "no probe fired in this run: nothing the spec describes was counted (the note "
        "says which file no traced process mapped)"]
    (note,) = silent_notes(run.report)
    assert note == (f"no probe fired in this run: no traced process mapped {exe}, where "
                    "the spec's functions are probed"), note
