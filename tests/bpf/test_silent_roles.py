"""Spec roles a run never calls (issue 54, item 4): one note for them all, not a
"check the spec" line per role; counted in the traced processes only, so that the same
library called by another program on the machine (tests run in parallel) does not make
them look used; a command that never maps the probed file audited nothing (issue 39):
INCOMPLETE unless nothing of the spec's library was there to count (GLib's `bytes`
under the gobject spec)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd

from refcntd.session.run import NOTHING_FIRED
from refcntd.session.status import NOTHING_LOADED

GLIB_TESTS = Path("/usr/libexec/installed-tests/glib")


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


def test_a_command_with_its_own_copy_of_the_functions_is_incomplete(bpf, exe, tmp_path):
    """Nothing was audited, and the command had the spec's functions in a file of another
    name (the same sources built again): issue 39's rule, kept: INCOMPLETE, with one note
    naming the file no traced process mapped, and no line per role."""
    spec = tmp_path / "exe.yaml"
    spec.write_text(f"""version: 1
name: verdicts
library: {exe}
roles:
  init: {{functions: [__refcnt__init], object: arg3, type: {{name: obj}}}}
  get: {{functions: [__refcnt__get], object: arg2}}
  put: {{functions: [__refcnt__put], object: arg2}}
""")
    other = cc(tmp_path / "other", [FIXTURES / "verdicts.c", EXAMPLES / "refcnt.c"], ["-O2"])
    run = refcntd(["run", "--spec", str(spec), "--", str(other), "reachable"],
                  tmp_path / "r.json")
    assert run.returncode == 24, run.stderr
    assert list(run.report["tracing"]["lost"]) == [NOTHING_FIRED]
    (note,) = silent_notes(run.report)
    assert note == (f"no probe fired in this run: no traced process mapped {exe}, where "
                    "the spec's functions are probed"), note


@pytest.mark.parametrize("test", ["bytes", "mainloop", "private"])
def test_a_glib_test_that_never_loads_libgobject(bpf, tmp_path, test):
    """GLib's installed tests `bytes`, `mainloop` and `private` link libglib only, and
    none of their processes loads libgobject (strace: no open of it): under the gobject
    spec there was nothing to count.  Complete, exit 0, with one note saying so, not
    INCOMPLETE (issue 54, item 4); --strict still exits 24."""
    program = GLIB_TESTS / test
    if not program.exists():
        pytest.skip("Debian's libglib2.0-tests is not installed")
    run = refcntd(["run", "--spec", "gobject", "--", str(program)], tmp_path / "r.json")
    assert run.returncode == 0, run.stderr
    assert run.report["tracing"]["lost"] == {}
    (note,) = silent_notes(run.report)
    assert note.startswith(f"{NOTHING_LOADED}: no traced process loaded libgobject-2.0.so.0 "
                           "or another copy, and none of the "), note
    strict = refcntd(["run", "--strict", "--spec", "gobject", "--", str(program)])
    assert strict.returncode == 24, strict.stderr
