"""kept_by_library with valgrind stacks (`valgrind:` files, `stack:` lists), and
--suppressions with a .supp file: parsed strictly, matched, counted and shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from refcntd.analysis import kept
from refcntd.analysis.model import LeakedObject, LeakGroup, ProcessReport, RunResult
from refcntd.errors import ConfigError
from refcntd.inputs.spec import load_spec
from refcntd.outputs.policy import SUPPRESSED, Policy
from refcntd.symbolize.symbolizer import Frame

LIBGOBJECT = "/usr/lib/x86_64-linux-gnu/libgobject-2.0.so.0.7400.6"
LIBGIO = "/usr/lib/x86_64-linux-gnu/libgio-2.0.so.0.7400.6"

SPEC = """\
version: 1
name: objs
library: libgobject-2.0.so.0
roles:
  init: {functions: [g_object_new_with_properties], object: return, type: {name: GObject}}
  get: {functions: [g_object_ref], object: arg1}
  put: {functions: [g_object_unref], object: arg1}
kept_by_library:
"""

SUPP = """\
{
   vfs-singleton
   Memcheck:Leak
   match-leak-kinds: reachable
   fun:calloc
   ...
   fun:g_object_new_with_properties
   fun:g_object_new
   ...
   fun:g_vfs_get_default
}
{
   never
   Memcheck:Leak
   fun:malloc
   ...
   fun:no_such_function
}
{
   race
   Helgrind:Race
   fun:g_vfs_get_default
}
"""


def spec_with(tmp_path: Path, rules: str) -> str:
    (tmp_path / "objs.supp").write_text(SUPP)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC + rules.replace("SUPP", str(tmp_path / "objs.supp")))
    return str(path)


def group(*functions: str, n: int = 1, type_name: str = "GObject") -> LeakGroup:
    frames = tuple(Frame(LIBGIO if f.startswith("g_vfs") or not f else LIBGOBJECT, 0x100 + i,
                         function=f) for i, f in enumerate(functions))
    return LeakGroup(type_name, frames, [LeakedObject(0x10 * i, 1, 0, 0, 0) for i in range(n)])


SINGLETON = ("g_object_new", "", "g_vfs_get_default", "main")


def test_a_valgrind_file_keeps_and_counts_per_entry(tmp_path):
    spec = load_spec(spec_with(tmp_path, "  - {valgrind: SUPP, reason: GIO's singletons}\n"))
    (rule,) = spec.kept_by_library
    assert [s.name for s in rule.stacks] == ["vfs-singleton", "never"]
    assert rule.other_entries == 1
    mine = group("g_object_new", "main")
    report = ProcessReport(1, "gio", ["gio"], "exited", groups=[group(*SINGLETON, n=2), mine])
    kept.set_aside(report, spec.kept_by_library)
    assert report.groups == [mine]
    assert report.kept == {"GIO's singletons (objs.supp: 1 of 2 entries used: "
                           "vfs-singleton x2; 1 unused)": 2}


def test_the_constructor_frame_anchors_its_caller(tmp_path):
    """The entry names g_object_new_with_properties, probed at its return, then
    g_object_new: that must be frame 0 (the constructor's caller), not any frame."""
    spec = load_spec(spec_with(tmp_path, "  - {valgrind: SUPP, reason: r}\n"))
    (rule,) = spec.kept_by_library
    assert kept.matching_stack(rule, group(*SINGLETON)) is not None
    assert kept.matching_stack(rule, group("other", *SINGLETON)) is None


def test_inline_stack_and_type(tmp_path):
    rules = ('  - type: GObject\n    stack: ["fun:g_object_new", "...", "fun:g_vfs_*"]\n'
             "    reason: the default GVfs\n")
    spec = load_spec(spec_with(tmp_path, rules))
    report = ProcessReport(1, "gio", [], "exited",
                           groups=[group(*SINGLETON), group(*SINGLETON, type_name="GVariant")])
    kept.set_aside(report, spec.kept_by_library)
    assert [g.type_name for g in report.groups] == ["GVariant"]
    assert report.kept == {"the default GVfs": 1}


def test_an_absent_optional_file_keeps_nothing_and_check_says_so(tmp_path):
    rules = "  - {valgrind: /nonexistent/glib.supp, optional: true, reason: GLib's own}\n"
    spec = load_spec(spec_with(tmp_path, rules))
    (rule,) = spec.kept_by_library
    assert rule.absent and rule.stacks == ()
    assert kept.describe(spec) == ["kept_by_library: /nonexistent/glib.supp is absent "
                                   "(optional): keeps nothing here (GLib's own)"]
    report = ProcessReport(1, "p", [], "exited", groups=[group(*SINGLETON)])
    kept.set_aside(report, spec.kept_by_library)
    assert len(report.groups) == 1 and report.kept == {}


def test_check_describes_a_present_file(tmp_path):
    spec = load_spec(spec_with(tmp_path, "  - {valgrind: SUPP, reason: r, type: GObject}\n"))
    assert kept.describe(spec) == [
        f"kept_by_library: {tmp_path}/objs.supp: 2 Memcheck:Leak entries (1 for other tools "
        "or kinds, unused), type GObject: r"]


@pytest.mark.parametrize("rules,line,key,problem", [
    ("  - {valgrind: /nonexistent.supp, reason: r}\n", 9, "kept_by_library[0].valgrind",
     "no such file (`optional: true` if it may be absent)"),
    ("  - {valgrind: SUPP, created_in: [x], reason: r}\n", 9, "kept_by_library[0]",
     "exactly one of"),
    ("  - {stack: [], reason: r}\n", 9, "kept_by_library[0].stack", "at least one frame"),
    ('  - {stack: ["fun:f", "src:x.c"], reason: r}\n', 9, "src:x.c", "fun:PATTERN"),
    ("  - {created_in: [x], optional: true, reason: r}\n", 9, "kept_by_library[0].optional",
     "only a valgrind file"),
])
def test_mistakes_name_their_line(tmp_path, rules, line, key, problem):
    with pytest.raises(ConfigError) as err:
        load_spec(spec_with(tmp_path, rules))
    assert (err.value.lineno, err.value.key) == (line, key)
    assert problem in err.value.problem


def test_a_broken_supp_file_names_its_own_line(tmp_path):
    (tmp_path / "bad.supp").write_text("{\n  x\n  Memcheck:Leak\n  fun:f\n  bogus\n}\n")
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC + f"  - {{valgrind: {tmp_path}/bad.supp, reason: r}}\n")
    with pytest.raises(ConfigError) as err:
        load_spec(str(path))
    assert (err.value.path, err.value.lineno) == (f"{tmp_path}/bad.supp", 5)


# ---- --suppressions with a .supp file ---------------------------------------------------

def run_with(*groups: LeakGroup, spec: str = "gobject") -> RunResult:
    return RunResult("run", spec, "gio", [ProcessReport(7, "gio", ["gio"], "exited",
                                                         groups=list(groups))])


def test_suppressions_take_a_supp_file(tmp_path):
    supp = tmp_path / "objs.supp"
    supp.write_text(SUPP)
    mine = group("g_object_new", "main")
    verdict = Policy.build(str(supp), [], []).evaluate(run_with(group(*SINGLETON), mine))
    statuses = {len(f.frames): f.status for f in verdict.findings}
    assert statuses == {len(SINGLETON): SUPPRESSED, 2: "failing"}
    assert [f"{r} (line {r.line})" for r in verdict.unused_rules] == ["valgrind:never (line 12)"]


def test_suppressions_without_the_spec_use_no_constructor(tmp_path):
    """A saved run whose spec is not on this machine: the entry's constructor frame is
    then matched as a frame (and here, not found)."""
    supp = tmp_path / "objs.supp"
    supp.write_text(SUPP)
    verdict = Policy.build(str(supp), [], []).evaluate(
        run_with(group(*SINGLETON), spec="/nonexistent/spec.yaml"))
    assert [f.status for f in verdict.findings] == ["failing"]


def test_lsan_lines_use_lsans_matching(tmp_path):
    rules = tmp_path / "lsan.txt"
    rules.write_text("leak:^g_vfs*default$\nleak:libgio-2.0.so\n")
    verdict = Policy.build(str(rules), [], []).evaluate(run_with(group(*SINGLETON)))
    assert [f.status for f in verdict.findings] == [SUPPRESSED]
    assert [str(r) for r in verdict.unused_rules] == ["leak:libgio-2.0.so"]


def test_check_warns_of_an_entry_that_keeps_everything(tmp_path):
    (tmp_path / "all.supp").write_text("{\n  all\n  Memcheck:Leak\n  fun:malloc\n}\n")
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC + f"  - {{valgrind: {tmp_path}/all.supp, reason: r}}\n")
    lines = kept.describe(load_spec(str(path)))
    assert lines[1] == (f"  entry all ({tmp_path}/all.supp:1) has only allocator frames: "
                        "it keeps every object")


def test_unused_supp_entries_are_one_line(tmp_path):
    supp = tmp_path / "objs.supp"
    supp.write_text(SUPP + SUPP.replace("vfs-singleton", "other").replace("never", "never2"))
    verdict = Policy.build(str(supp), [], []).evaluate(run_with(group(*SINGLETON)))
    assert [f"{r} (line {r.line})" for r in verdict.unused_rules] == [
        "valgrind:3 of 4 entries unused (never, other, never2) (line 12)"]
