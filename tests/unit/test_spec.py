"""Spec loading: strict, with file, line and key in every error (no BPF needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, refcntd

from refcntd.errors import ConfigError
from refcntd.inputs.spec import ExistingReturn, load_spec, load_specs

VALID = """\
version: 1
name: foo
roles:
  init: {functions: [foo_new], object: return, type: {name: foo}}
  get: {functions: [foo_ref], object: arg1}
  put: {functions: [foo_unref, foo_release], object: arg1}
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "specs").glob("*.yaml")))
def test_every_bundled_spec_loads(path):
    spec = load_spec(str(path))
    assert {"init", "get", "put"} <= spec.roles.keys()


def test_default_spec_reads_the_perf_stub_arguments():
    spec = load_spec("perf-stubs")
    (init,) = spec.roles["init"]
    assert (init.obj.arg, init.type_name.arg, init.initial_count.arg) == (3, 4, 2)
    assert spec.roles["get"][0].obj.arg == 2 and spec.roles["delete"][0].obj.arg == 1


def test_library_api_with_constructor_and_fixed_type(tmp_path):
    spec = load_spec(write(tmp_path, VALID))
    (init,) = spec.roles["init"]
    assert init.obj.is_return and init.type_name.constant == "foo"
    assert init.initial_count.constant == 1
    assert spec.roles["put"][0].functions == ("foo_unref", "foo_release")
    assert not spec.has_delete


@pytest.mark.parametrize("text,line,key,problem", [
    (VALID.replace("version: 1", "version: 2"), 1, "version", "out of range"),
    (VALID + "colour: red\n", 7, "colour", "unknown key"),
    (VALID.replace("object: arg1}", "objekt: arg1}", 1), 5, "roles.get.objekt", "unknown key"),
    (VALID.replace("object: arg1}", "object: arg9}", 1), 5, "roles.get.object", "1..6"),
    (VALID.replace("object: arg1}", "object: return}", 1).replace("foo_ref", "x").replace(
        "put: {functions: [foo_unref, foo_release], object: arg1}",
        "put: {functions: [y], object: return}"), 6, "roles.put.object", "return value"),
    (VALID.replace("  get: {functions: [foo_ref], object: arg1}\n", ""), 3, "roles",
     "missing required key 'get'"),
    (VALID.replace("[foo_new]", "[]"), 4, "roles.init.functions", "at least one"),
    (VALID.replace("[foo_new]", "['foo new']"), 4, "roles.init.functions[0]", "not a symbol"),
    (VALID.replace("{name: foo}", "{name: foo, arg: 2}"), 4, "roles.init.type", "exactly one"),
    ("version: 1\nname: foo\nroles: [1, 2]\n", 3, "roles", "expected a mapping"),
    ("version: 1\nname: [\n", 3, "(syntax)", ""),
    ("", 1, "(top level)", "empty"),
])
def test_bad_specs_name_file_line_and_key(tmp_path, text, line, key, problem):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    err = info.value
    assert (err.path, err.lineno, err.key) == (path, line, key), err.message
    assert problem in err.problem
    assert err.message.startswith(f"{path}:{line}: {key}: ")


def test_cli_reports_bad_spec_in_one_line(tmp_path):
    path = write(tmp_path, VALID.replace("object: arg1}", "object: arg0}", 1))
    result = refcntd(["check", "--binary", "/bin/true", "--spec", path])
    assert result.returncode == 2
    assert_one_line_error(result, f"{path}:5: roles.get.object:")


def test_unknown_bundled_spec_name(tmp_path):
    result = refcntd(["check", "--binary", "/bin/true", "--spec", "nosuchspec"])
    assert_one_line_error(result, "no bundled spec named 'nosuchspec'", "perf-stubs")


SEMANTICS = """\
version: 1
name: rich
library: libfoo.so.1
kept_by_library:
  - {type: Foo, created_in: ["libfoo.so*"], reason: the library's own table}
roles:
  init:
    - {functions: [foo_new, foo_dup], object: return, type: {name: Foo}}
    - {functions: [foo_make], object: {out: arg2}, type: {arg: 1, deref: [16, 8]},
       static_if: {offset: 0, value: -1}}
  get: {functions: [foo_ref], object: arg1, may_be_leaked: {offset: 16, mask: 4},
        revives: true}
  put:
    - {functions: [foo_unref], object: arg1, frees_at_zero: true}
    - {functions: [bar_unref], object: arg1}
    - {functions: [foo_unref_to_data], object: arg1, absorbs_inner_put: true}
  delete: {usdt: "foo:dispose", object: arg1, inside_last_put: before,
           unknown_objects: count}
  sink: {functions: [foo_ref_sink], object: arg1, floating_flag: {offset: 4, mask: 1}}
  check: {functions: [foo_mark], object: return, may_be_leaked: {offset: 48, mask: 1}}
"""


def test_semantics_real_apis_need(tmp_path):
    spec = load_spec(write(tmp_path, SEMANTICS))
    new, make = spec.roles["init"]
    assert new.functions == ("foo_new", "foo_dup") and new.type_name.constant == "Foo"
    assert make.obj.out and make.obj.arg == 2 and make.obj.at_return
    assert make.type_name.deref == (16, 8) and make.static_if == (0, -1)
    assert spec.roles["put"][0].frees_at_zero and not spec.roles["put"][1].frees_at_zero
    assert [p.absorbs_put for p in spec.roles["put"]] == [False, False, True]
    (delete,) = spec.roles["delete"]
    assert delete.inside_last_put == "before" and delete.quiet_unknown
    assert spec.roles["sink"][0].floating_flag == (4, 1)
    assert spec.roles["get"][0].may_be_leaked == (16, 4) and spec.roles["get"][0].revives
    assert spec.roles["check"][0].obj.is_return
    assert spec.kept_by_library[0].created_in == ("libfoo.so*",)


@pytest.mark.parametrize("old,new,key,problem", [
    ("inside_last_put: before", "inside_last_put: during", "roles.delete.inside_last_put",
     "one of"),
    ("frees_at_zero: true}", "frees_at_zero: 1}", "roles.put[0].frees_at_zero",
     "true or false"),
    ("{functions: [foo_ref], object: arg1, may", "{functions: [foo_ref], object: arg1, "
     "frees_at_zero: true, may", "roles.get.frees_at_zero", "unknown key"),
    ("absorbs_inner_put: true", "absorbs_inner_put: yes please",
     "roles.put[2].absorbs_inner_put", "true or false"),
    ("revives: true", "revives: true, absorbs_inner_put: true", "roles.get.absorbs_inner_put",
     "unknown key"),
    ("deref: [16, 8]", "deref: [16, 8, 0]", "roles.init[1].type.deref", "1..2"),
    ("{out: arg2}", "{out: arg9}", "roles.init[1].object.out", "1..6"),
    ("floating_flag: {offset: 4, mask: 1}", "floating_flag: {offset: 4}",
     "roles.sink.floating_flag", "missing required key 'mask'"),
    ("unknown_objects: count", "unknown_objects: hide", "roles.delete.unknown_objects",
     "one of"),
    ("reason: the library's own table", "why: x", "kept_by_library[0].why", "unknown key"),
])
def test_bad_semantics_name_file_line_and_key(tmp_path, old, new, key, problem):
    assert old in SEMANTICS
    path = write(tmp_path, SEMANTICS.replace(old, new))
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    assert info.value.key == key, info.value.message
    assert problem in info.value.problem


EXISTING = """\
version: 1
name: ctors
roles:
  init:
    - {functions: [reg_get], object: return, type: {name: Reg}, may_return_existing: get}
    - {functions: [svc_new], object: return, type: {name: Svc}, may_return_existing: counted}
    - {functions: [d2i_foo], object: return, type: {name: Foo},
       may_return_existing: {reuses: arg1}}
    - {functions: [foo_read], object: {out: arg2}, type: {name: Foo},
       may_return_existing: {reuses: arg2}}
    - {functions: [foo_new], object: return, type: {name: Foo}}
  get: {functions: [foo_ref], object: arg1}
  put: {functions: [foo_unref], object: arg1}
"""


def test_constructors_that_may_return_an_existing_object(tmp_path):
    reg, svc, d2i, read, new = load_spec(write(tmp_path, EXISTING)).roles["init"]
    assert reg.may_return_existing == ExistingReturn(get=True)
    assert svc.may_return_existing == ExistingReturn()
    assert d2i.may_return_existing == ExistingReturn(reused_arg=1)
    assert read.may_return_existing == ExistingReturn(reused_arg=2)
    assert new.may_return_existing is None
    assert "a get on it" in reg.may_return_existing.describe()
    assert "*argument 1" in d2i.may_return_existing.describe()


@pytest.mark.parametrize("old,new,problem", [
    ("may_return_existing: get}", "may_return_existing: true}", "one of get, counted"),
    ("may_return_existing: get}", "may_return_existing: always}", "one of get, counted"),
    ("{reuses: arg1}", "{reuses: arg7}", "1..6"),
    ("{reuses: arg1}", "{reused: arg1}", "unknown key"),
    ("{reuses: arg2}", "{reuses: arg1}", "*arg2"),
    ("{functions: [foo_new], object: return, type: {name: Foo}}",
     "{functions: [foo_new], object: arg1, type: {name: Foo}, may_return_existing: get}",
     "read at its return"),
    ("get: {functions: [foo_ref], object: arg1}",
     "get: {functions: [foo_ref], object: arg1, may_return_existing: get}", "unknown key"),
])
def test_bad_may_return_existing_names_the_problem(tmp_path, old, new, problem):
    assert old in EXISTING
    with pytest.raises(ConfigError) as info:
        load_spec(write(tmp_path, EXISTING.replace(old, new)))
    assert "may_return_existing" in info.value.key or "unknown key" in info.value.problem
    assert problem in info.value.problem, info.value.problem


@pytest.mark.parametrize(("old", "new", "line", "key", "other"), [
    ("put: {functions: [foo_unref, foo_release]", "put: {functions: [foo_unref, foo_ref]",
     6, "roles.put.functions[1]", "get"),
    ("get: {functions: [foo_ref]", "get: {functions: [foo_new]", 5, "roles.get.functions[0]",
     "init"),
])
def test_one_function_in_two_roles_is_rejected(tmp_path, old, new, line, key, other):
    with pytest.raises(ConfigError) as err:
        load_spec(write(tmp_path, VALID.replace(old, new)))
    assert (err.value.lineno, err.value.key) == (line, key)
    assert f"is already the {other} function" in err.value.problem


def test_same_function_name_in_two_libraries_is_two_functions(tmp_path):
    text = VALID.replace("get: {functions: [foo_ref]", "get: {functions: [foo_new], library: b")
    assert load_spec(write(tmp_path, text)).roles["get"][0].functions == ("foo_new",)


def test_every_mistake_is_reported_at_once(tmp_path):
    """Two wrong roles and a wrong kept rule: three lines, one per mistake, exit 2."""
    path = write(tmp_path, "version: 1\nname: buf\nroles:\n"
                           "  init: {functions: [buf_new], object: retrun, type: {name: buf}}\n"
                           "  get:\n    - {functions: [buf_ref], object: args1}\n"
                           "    - {functions: [buf_ref2], object: arg1}\n"
                           "  put: {functions: [buf_unref], object: arg1}\n"
                           "kept_by_library:\n  - {created_in: [x]}\n")
    result = refcntd(["check", "--spec", path, "--binary", "/bin/true"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line.split(": ")[1:3] for line in lines] == [
        [f"{path}:4", "roles.init.object"], [f"{path}:6", "roles.get[0].object"],
        [f"{path}:10", "kept_by_library[0]"]], lines


def test_two_specs_compose_into_one():
    """--spec glib --spec gobject: both APIs' roles and kept rules, each file once."""
    glib, gobject = load_spec("glib"), load_spec("gobject")
    both = load_specs(["glib", "gobject"])
    assert both.name == "glib+gobject"
    assert both.libraries() == glib.libraries() | gobject.libraries()
    assert set(both.entries) == set(glib.entries) | set(gobject.entries)
    assert len(both.entries) == len(glib.entries) + len(gobject.entries)
    assert set(both.kept_by_library) == set(glib.kept_by_library) | set(gobject.kept_by_library)
    assert load_specs(["gobject", str(ROOT / "configs/specs/gobject.yaml")]) == gobject
    assert load_specs([]) == load_spec("perf-stubs")


def test_a_function_two_specs_give_differently_is_refused(tmp_path):
    """gobject's g_object_unref as a put; a library's own spec making it a delete would
    count each call twice: refused where the second spec writes it."""
    path = write(tmp_path, "version: 1\nname: mine\nlibrary: libgobject-2.0.so.0\nroles:\n"
                           "  init: {functions: [my_new], object: return, type: {name: My}}\n"
                           "  get: {functions: [my_ref], object: arg1}\n"
                           "  put: {functions: [my_unref], object: arg1}\n"
                           "  delete: {functions: [g_object_unref], object: arg1}\n")
    with pytest.raises(ConfigError) as err:
        load_specs(["gobject", path])
    assert (err.value.path, err.value.lineno, err.value.key) == \
        (path, 8, "roles.delete.functions[0]")
    assert "'g_object_unref' is also the put function of" in err.value.problem
    assert "gobject.yaml" in err.value.problem
    result = refcntd(["check", "--spec", "gobject", "--spec", path, "--binary", "/bin/true"])
    assert_one_line_error(result, f"{path}:8", "g_object_unref")


def test_checks_unless_scanned_are_dropped_where_the_scan_reads_the_flag(tmp_path):
    """gstreamer's check role on gst_object_* is probed only without an exit scan; a
    check without unless_scanned stays either way."""
    gst = load_spec("gstreamer")
    (check,) = gst.roles["check"]
    assert check.unless_scanned and check.may_be_leaked == (48, 1)
    assert "check" not in gst.scanned().roles
    assert {r: len(e) for r, e in gst.scanned().roles.items()} == \
        {r: len(e) for r, e in gst.roles.items() if r != "check"}
    plain = load_spec(write(tmp_path, VALID + "  check: {functions: [foo_peek], object: arg1, "
                                              "may_be_leaked: {offset: 8, mask: 2}}\n"))
    assert plain.scanned() == plain
    with pytest.raises(ConfigError, match="unless_scanned"):
        load_spec(write(tmp_path, VALID.replace("object: arg1}", "object: arg1, "
                                                "unless_scanned: true}", 1)))
