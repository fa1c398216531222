"""Issue 39, item 2: a spec that names one copy of a library, a test that loads another.

`spec draft` writes the library's path in the build tree; the test loads a copy
of the same build from elsewhere (a second build directory, the installed copy,
a CI cache).  Uprobes are per file, so a probe on the named copy never fires:
the run used to exit 0, "nothing lost", for a test that leaks.  Now the copy
the program loads is traced when it is the same build (exit 23 with the exact
leaks), and a run whose library roles never fired while a traced process
loaded another copy of that library is INCOMPLETE (24), never clean.

Truth (tests/fixtures/bufprog.c): `bufprog 8` leaks exactly 2 buffers, each
with final count 1.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES, leak_summary, refcntd
from test_userlib import confirmed_draft

from refcntd.session.run import NOTHING_FIRED
from refcntd.session.status import NOTHING_LOADED

REQUESTS = "8"
TRUTH = {"buf": [1, 1]}  # every 4th request of 8 leaks one buffer


def two_copies(root: Path, *lib_flags: str, other_flags: tuple[str, ...] | None = None
               ) -> tuple[Path, Path, Path]:
    """(the spec's copy a/libbuf.so, the loaded copy b/libbuf.so, bufprog whose RUNPATH
    is b/): b is a byte copy of a, or a build with `other_flags` when given."""
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    named, loaded = root / "a" / "libbuf.so", root / "b" / "libbuf.so"

    def build_lib(out: Path, flags: tuple[str, ...]) -> None:
        subprocess.run(["gcc", "-O2", "-g", "-fPIC", "-shared", "-Wl,-soname,libbuf.so",
                        *flags, "-o", str(out), str(FIXTURES / "libbuf.c")], check=True)
    build_lib(named, lib_flags)
    if other_flags is None:
        shutil.copy2(named, loaded)
    else:
        build_lib(loaded, other_flags)
    prog = root / "bufprog"
    subprocess.run(["gcc", "-O2", "-g", f"-I{FIXTURES}", "-o", str(prog),
                    str(FIXTURES / "bufprog.c"), f"-L{loaded.parent}", "-lbuf",
                    f"-Wl,-rpath,{loaded.parent}"], check=True)
    return named, loaded, prog


def run(spec: Path, command: list[str], json_path: Path, strict: bool) -> tuple[int, str, dict]:
    flags = ["--strict"] if strict else []
    result = refcntd(["run", "--spec", str(spec), *flags, "--", *command], json_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.report is not None, result.stderr
    return result.returncode, result.stderr, result.report


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("build_id", [True, False])
def test_the_copy_the_program_loads_is_traced(bpf, tmp_path, strict, build_id):
    """Same build (the same build-id, or without one the same soname and contents),
    another directory: the loaded copy is traced, the exact leaks, exit 23."""
    flags = () if build_id else ("-Wl,--build-id=none",)
    named, loaded, prog = two_copies(tmp_path / "t", *flags)
    spec = confirmed_draft(named, tmp_path / "draft.yaml", str(named))
    code, err, report = run(spec, [str(prog), REQUESTS], tmp_path / "r.json", strict)
    assert code == 23, err
    (process,) = report["processes"]
    assert leak_summary(process) == TRUTH
    assert f"the spec names {named}; bufprog loads {loaded}, the same build" in err
    modules = {p["module"] for p in report["tracing"]["probes"]}
    assert str(loaded) in modules and str(named) not in modules, modules  # (or bufprog's calls)


@pytest.mark.parametrize("strict", [False, True])
def test_a_copy_loaded_by_an_execd_program_is_never_clean(bpf, tmp_path, strict):
    """The command is a shell; the test it runs loads the other copy.  Whichever way
    the copy is handled, the run is never 0; when it is not traced, one line says
    which copy was loaded and which the spec named."""
    named, loaded, prog = two_copies(tmp_path / "t")
    spec = confirmed_draft(named, tmp_path / "draft.yaml", str(named))
    code, err, report = run(spec, ["/bin/sh", "-c", f"{prog} {REQUESTS}"],
                            tmp_path / "r.json", strict)
    assert code in (23, 24), err
    if code == 23:
        assert [leak_summary(p) for p in report["processes"] if p["groups"]] == [TRUTH]
        return
    lost = report["tracing"]["lost"]
    (line,) = [k for k in lost if str(loaded) in k]
    assert f"loaded {loaded}, the same build as the library the spec names ({named})" in line
    assert "tracing INCOMPLETE" in err, err


@pytest.mark.parametrize("strict", [False, True])
def test_another_build_at_the_soname_is_incomplete(bpf, tmp_path, strict):
    """The program loads another build of libbuf.so than the spec's file: not traced
    in its place (it is not the same library), and the run is INCOMPLETE, saying which
    copy was loaded and which the spec named."""
    named, loaded, prog = two_copies(tmp_path / "t", other_flags=("-O1",))
    spec = confirmed_draft(named, tmp_path / "draft.yaml", str(named))
    code, err, report = run(spec, [str(prog), REQUESTS], tmp_path / "r.json", strict)
    assert code == 24, err
    assert f"the spec names {named}; bufprog loads {loaded}, another build" in err
    (line,) = [k for k in report["tracing"]["lost"] if str(loaded) in k]
    assert line.startswith("spec role(s) never fired (init, get, put)"), line
    assert f"loaded {loaded}, another build than the library the spec names ({named})" in line


@pytest.mark.parametrize("strict", [False, True])
def test_a_program_with_the_library_linked_in_is_incomplete(bpf, tmp_path, strict):
    """The spec's library is probed; the command never loads it but has its functions
    linked in (libbuf.c compiled into the program): nothing was audited and the spec
    could not have counted it, so the run is INCOMPLETE (24), not clean."""
    named, _loaded, _prog = two_copies(tmp_path / "t")
    spec = confirmed_draft(named, tmp_path / "draft.yaml", str(named))
    static = tmp_path / "bufstatic"
    subprocess.run(["gcc", "-O2", "-g", f"-I{FIXTURES}", "-o", str(static),
                    str(FIXTURES / "bufprog.c"), str(FIXTURES / "libbuf.c")], check=True)
    code, err, report = run(spec, [str(static), REQUESTS], tmp_path / "r.json", strict)
    assert code == 24, err
    assert list(report["tracing"]["lost"]) == [NOTHING_FIRED]


def test_a_command_that_loads_nothing_of_the_library_is_complete(bpf, tmp_path):
    """The spec's library is probed; the command (/bin/true) loads neither it nor another
    copy and has none of its functions: there was nothing to count, and one note says
    so (GLib's `bytes` under the gobject spec: test_silent_roles).  --strict still never
    passes a run in which no probe fired (issue 39)."""
    named, _loaded, _prog = two_copies(tmp_path / "t")
    spec = confirmed_draft(named, tmp_path / "draft.yaml", str(named))
    code, err, report = run(spec, ["/bin/true"], tmp_path / "r.json", False)
    assert code == 0, err
    assert report["tracing"]["lost"] == {}
    (note,) = [n for n in report["tracing"]["notes"] if n.startswith("no probe fired")]
    assert note.startswith(f"{NOTHING_LOADED}: no traced process loaded libbuf.so or another "
                           "copy, and none of the "), note
    assert "none fired (see the notes)" in err, err
    code, err, _ = run(spec, ["/bin/true"], tmp_path / "strict.json", True)
    assert code == 24 and "--strict: no probe fired" in err, err


@pytest.mark.parametrize("via_shell", [False, True])
def test_a_run_that_maps_the_library_and_never_calls_it_is_complete(bpf, tmp_path, via_shell):
    """`bufprog 0` loads the spec's library and handles no request: the probes were armed
    in a process that made no buffer, so nothing was missed: exit 0 with a note naming
    the file, not INCOMPLETE (GLib's tests `enums`, `closure` link libgobject and make no
    GObject).  Directly or exec'd by a shell.  --strict still never passes a run where no
    probe fired (issue 39)."""
    _named, loaded, prog = two_copies(tmp_path / "t")
    spec = confirmed_draft(loaded, tmp_path / "draft.yaml", str(loaded))
    command = ["/bin/sh", "-c", f"{prog} 0; true"] if via_shell else [str(prog), "0"]
    code, err, report = run(spec, command, tmp_path / "r.json", False)
    assert code == 0, err
    assert report["tracing"]["lost"] == {}
    assert all(p["hits"] == 0 for p in report["tracing"]["probes"])
    (note,) = [n for n in report["tracing"]["notes"] if n.startswith("no probe fired")]
    assert f"traced processes mapped {loaded}" in note and "never called" in note, note
    code, err, _ = run(spec, command, tmp_path / "strict.json", True)
    assert code == 24 and "--strict: no probe fired" in err, err
