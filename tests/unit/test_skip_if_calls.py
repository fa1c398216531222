"""`skip_if_calls`: one spec for two releases of a library, one whose convenience
constructor hands over to the general one and one whose does not (GLib 2.74 and
2.84's g_variant_new_int32, cairo 1.16 and 1.18's cairo_pattern_create_rgb)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cc

from refcntd.binary.plan import build_plan
from refcntd.errors import ConfigError
from refcntd.inputs.spec import load_spec

LIB = r"""
#include <stdlib.h>
struct obj { int refs; long value; };
#define API __attribute__((noinline, noipa, visibility("default")))
API struct obj *obj_new_general(long value)
{ struct obj *o = malloc(sizeof *o); o->refs = 1; o->value = value; return o; }
#ifdef HANDS_OVER
API struct obj *obj_new_int(int v) { return obj_new_general(v * 2L); }
#else
API struct obj *obj_new_int(int v)
{ struct obj *o = malloc(sizeof *o); o->refs = 1; o->value = v; return o; }
#endif
API void obj_ref(struct obj *o) { o->refs++; }
API void obj_unref(struct obj *o) { if (--o->refs == 0) free(o); }
"""

SPEC = """\
version: 1
name: twoway
library: {lib}
roles:
  init:
    - {{functions: [obj_new_general], object: return, type: {{name: obj}}}}
    - functions: [obj_new_int]
      skip_if_calls: {skip}
      object: return
      type: {{name: obj}}
  get: {{functions: [obj_ref], object: arg1}}
  put: {{functions: [obj_unref], object: arg1}}
"""


def _library(tmp_path: Path, hands_over: bool) -> Path:
    src = tmp_path / "obj.c"
    src.write_text(LIB)
    flags = ["-O2", "-shared", "-fPIC"] + (["-DHANDS_OVER"] if hands_over else [])
    return cc(tmp_path / ("handsover" if hands_over else "itself") / "libobj.so", [src], flags)


def _spec(tmp_path: Path, lib: Path, skip: str = "[obj_new_general]") -> str:
    path = tmp_path / "twoway.yaml"
    path.write_text(SPEC.format(lib=lib, skip=skip))
    return str(path)


@pytest.mark.parametrize("hands_over", [True, False])
def test_a_constructor_is_probed_only_where_it_does_not_hand_over(tmp_path, hands_over):
    plan = build_plan(load_spec(_spec(tmp_path, _library(tmp_path, hands_over))), "/bin/true")
    inits = sorted({s.function for s in plan.sites if s.role == "init"})
    note = ("init: obj_new_int not probed: each calls obj_new_general in this build "
            "(skip_if_calls), which counts it")
    assert plan.problems == []
    if hands_over:
        assert inits == ["obj_new_general"] and note in plan.notes
    else:
        assert inits == ["obj_new_general", "obj_new_int"] and note not in plan.notes


def test_without_it_check_says_each_object_would_be_created_twice(tmp_path):
    """The same two entries in one, no `skip_if_calls`: the existing check objects."""
    lib = _library(tmp_path, True)
    path = tmp_path / "one.yaml"
    path.write_text(SPEC.format(lib=lib, skip="[]").replace(
        "    - functions: [obj_new_int]\n      skip_if_calls: []\n      object: return\n"
        "      type: {name: obj}\n", "").replace("[obj_new_general]",
                                                  "[obj_new_general, obj_new_int]"))
    problems = build_plan(load_spec(str(path)), "/bin/true").problems
    assert problems == ["init: obj_new_int hands over to obj_new_general, both listed: each "
                        "object would be created twice; keep obj_new_general only"]


@pytest.mark.parametrize("skip, message", [
    ("[obj_new_int]", "'obj_new_int' is one of this entry's functions: it cannot skip itself"),
    ("[]", "needs at least one function name"),
    ("['not a name']", "'not a name' is not a symbol name"),
])
def test_bad_values_name_the_line(tmp_path, skip, message):
    with pytest.raises(ConfigError) as err:
        load_spec(_spec(tmp_path, tmp_path / "libobj.so", skip))
    assert message in str(err.value) and err.value.lineno == 8


def test_only_functions_can_skip(tmp_path):
    path = tmp_path / "usdt.yaml"
    path.write_text("version: 1\nname: u\nroles:\n"
                    "  init: {usdt: 'w:init', object: arg1, type: arg2,"
                    " skip_if_calls: [f]}\n"
                    "  get: {usdt: 'w:ref', object: arg1}\n"
                    "  put: {usdt: 'w:unref', object: arg1}\n")
    with pytest.raises(ConfigError, match="only an entry with 'functions'"):
        load_spec(str(path))
