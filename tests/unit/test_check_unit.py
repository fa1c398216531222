"""`refcntd check` and bad input: one clear line, the documented exit code."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import FIXTURES, assert_one_line_error, bad_binaries, cc, refcntd
from otheruser import NOBODY


@pytest.mark.parametrize("variant,expect", [
    ("O0", {"init": "+0", "get": "+0", "put": "+0", "delete": "+0"}),
    ("O2", {"init": "+0", "get": "+4", "put": "+0", "delete": "+0"}),
    ("O2fp", {"init": "+0", "get": "+4", "put": "+0", "delete": "+0"}),
])
@pytest.mark.parametrize("shared", [False, True], ids=["exe", "lib"])
def test_check_explains_each_probe(build, variant, expect, shared):
    target = build.stub_lib(variant) if shared else build.perflike(variant)
    result = refcntd(["check", "--probe-mode", "entry", "--binary", str(target)])
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for role, offset in expect.items():
        line = next(line for line in out.splitlines() if line.startswith(role))
        assert f"probe {offset} " in line, line
    if variant != "O0":
        assert "lock-prefixed instruction at +0 (lock add dword ptr [rdi], 1); probing +4" in out
        assert "caller: read from [rsp+0] at the probe" in out
    else:
        assert "entry instruction (push rbp) is emulated" in out
        assert "caller: in the kernel's stack walk" in out
    assert "build-id: " in out and "frame pointers: " in out
    assert "result: every role can be probed" in out


def test_check_refuses_clones_without_the_object_argument(build, tmp_path):
    src = tmp_path / "dropobj.c"
    # the stub set compiled into one -O3 unit: gcc clones stubs that ignore `obj`
    src.write_text(Path(FIXTURES.parent.parent / "examples/refcnt.c").read_text() + """
struct o { atomic_t r; };
#include <stdlib.h>
__attribute__((noinline)) struct o *o_new(void)
{ struct o *x = calloc(1, sizeof *x); refcnt__init(x, r, 1); return x; }
int main(void) { struct o *a = o_new(); for (int i = 0; i < 5; i++) refcnt__get(a, r);
  for (int i = 0; i < 5; i++) if (refcnt__put(a, r)) refcnt__exit(a, r); return 0; }
""")
    exe = cc(tmp_path / "dropobj", [src], ["-O3", "-fno-omit-frame-pointer"])
    result = refcntd(["check", "--binary", str(exe)])
    assert result.returncode == 24
    assert "PROBLEM: get: gcc made a copy __refcnt__get.constprop.0 of __refcnt__get" in \
        result.stdout
    assert "its object (argument 2) was optimized away" in result.stdout
    run = refcntd(["run", "--", str(exe)])
    assert_one_line_error(run, "__refcnt__get.constprop.0")


def test_check_places_clone_arguments_from_dwarf(tmp_path):
    exe = cc(tmp_path / "clones", [FIXTURES / "clones.c"], ["-O3", "-fno-omit-frame-pointer"])
    result = refcntd(["check", "--binary", str(exe), "--spec", "example-objapi"])
    assert result.returncode == 0, result.stdout
    assert "obj_get.constprop.0 at" in result.stdout
    assert "constprop clone of obj_get, arguments placed by DWARF" in result.stdout


def test_check_reports_inlined_copies(tmp_path):
    src = tmp_path / "inl.c"
    src.write_text("""
#include <stdlib.h>
struct obj { int refs; };
static inline void obj_get(struct obj *o, const char *w) { (void)w; o->refs++; }
__attribute__((noinline)) void obj_init(struct obj *o, const char *t) { (void)t; o->refs = 1; }
__attribute__((noinline)) int obj_put(struct obj *o, const char *w)
{ (void)w; return --o->refs == 0; }
int main(void) { struct obj *o = malloc(sizeof *o); obj_init(o, "obj"); obj_get(o, "x");
  return obj_put(o, "x"); }
""")
    exe = cc(tmp_path / "inl", [src], ["-O2"])
    result = refcntd(["check", "--binary", str(exe), "--spec", "example-objapi"])
    assert result.returncode == 24
    assert "get: obj_get was inlined at 1 call site(s)" in result.stdout


def test_stripped_binary(build, tmp_path):
    exe = tmp_path / "stripped"
    shutil.copy(build.perflike("O2"), exe)
    subprocess.run(["strip", "--strip-all", str(exe)], check=True)
    result = refcntd(["check", "--binary", str(exe)])
    assert result.returncode == 24
    assert f"PROBLEM: init: no function __refcnt__init in {exe} (stripped: no .symtab)" in \
        result.stdout
    # run: a stripped program may be a `make` whose children have the functions; once
    # none had them, the run is incomplete and says why
    run = refcntd(["run", "--", str(exe)])
    assert run.returncode == 24, run.stderr
    assert "tracing INCOMPLETE" in run.stderr
    assert "no program the command ran had the spec's functions" in run.stderr
    assert f"{exe} (stripped: no .symtab) has none of the spec's functions" in run.stderr


@pytest.mark.parametrize("case", ["missing", "directory", "script", "text", "elf32",
                                  "truncated", "truncated-headers", "no-stubs"])
def test_bad_binary_one_line(tmp_path, case):
    path, needle = bad_binaries(tmp_path)[case]
    result = refcntd(["check", "--binary", str(path)])
    if case == "no-stubs":
        assert result.returncode == 24 and "PROBLEM: init: no function" in result.stdout
    else:
        assert_one_line_error(result, needle)
    attach = refcntd(["attach", "--binary", str(path)], timeout=60)
    assert_one_line_error(attach, needle)


def test_run_unknown_command(tmp_path):
    result = refcntd(["run", "--", "no-such-command-xyz"])
    assert_one_line_error(result, "command not found: no-such-command-xyz")
    assert result.returncode == 2


def test_run_without_command():
    assert_one_line_error(refcntd(["run"]), "no command given")


def test_bad_option_is_one_line():
    result = refcntd(["attach"])
    assert_one_line_error(result, "--binary")
    assert result.returncode == 2


def as_nobody(other_user, args: list[str]) -> subprocess.CompletedProcess[str]:
    """refcntd run by `nobody`, from a copy it can reach (tests/otheruser.py): the
    checkout may sit where nobody cannot enter (/root is 0700)."""
    return subprocess.run([*NOBODY, *other_user.argv, *args], capture_output=True, text=True,
                          cwd=other_user.root, env=other_user.env, timeout=120)


@pytest.fixture
def reachable(build, other_user) -> Path:
    """perflike -O2 copied where nobody can read and run it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges")
    where = Path(tempfile.mkdtemp(prefix="check-", dir=other_user.root))
    where.chmod(0o755)
    return Path(shutil.copy2(build.perflike("O2"), where / "perflike"))


def test_not_root_gets_one_line(reachable, other_user):
    proc = as_nobody(other_user, ["run", "--", str(reachable)])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 24, proc.stderr
    assert lines == ["refcntd: tracing needs root, or CAP_BPF and CAP_PERFMON "
                     "(run as root, e.g. with sudo)"]


def test_check_needs_no_root(reachable, other_user):
    """issue 39: `check` as nobody printed the analysis, then a PermissionError traceback
    from the tracefs check (/sys/kernel/tracing is root's 0700); now the tracefs row says
    it cannot be read as this user, and check exits as documented (0: probeable)."""
    proc = as_nobody(other_user, ["check", "--binary", str(reachable)])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: every role can be probed" in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("tracing tracefs:")]
    tracefs = Path("/sys/kernel/tracing")
    if not os.stat(tracefs).st_mode & stat.S_IXOTH:
        assert row == f"tracing tracefs: not readable as this user ({tracefs}; tracing runs " \
            "as root)", row
    assert "tracing privileges: insufficient" in proc.stdout
