"""benchmarks/mutants/sites.mutate: each mutant form compiles to what its pattern says
(a get added keeps the object evaluated once where the get returns it, twice where
it returns nothing, as fontconfig's FcPatternReference)."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))

import sites  # noqa: E402

API = sites.Api(frozenset({"obj_get", "pat_ref"}), frozenset({"obj_put"}), {},
                {"obj_get": "o", "pat_ref": "p", "obj_put": "o"}, frozenset({"pat_ref"}))
CODE = ("void f(struct o *o, struct p *p)\n{\n\tpat_ref (p);\n\to = obj_get (o);\n"
        "\tobj_put (o);\n}\n")


def mutants(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "f.c").write_text(CODE)
    found = sites.find_sites(tmp_path, "f.c", API.gets | API.puts)
    return {s.name: sites.mutate(CODE, s, sites.pattern_of(s, API), API) for s in found}


def test_a_get_that_returns_nothing_is_called_twice(tmp_path: Path) -> None:
    assert "\t(pat_ref (p), pat_ref (p));\n" in mutants(tmp_path)["pat_ref"]


def test_a_get_that_returns_its_object_wraps_itself(tmp_path: Path) -> None:
    assert "\to = obj_get(obj_get (o));\n" in mutants(tmp_path)["obj_get"]


def test_a_deleted_put_still_evaluates_its_argument(tmp_path: Path) -> None:
    assert "\t((void)(o));\n" in mutants(tmp_path)["obj_put"]


def test_a_function_pointer_parameter_does_not_name_the_function(tmp_path: Path) -> None:
    """fontconfig's FcDirCacheProcess takes `FcBool (*callback) (...)`: its sites were
    read as in a function `FcBool` (a right answer scored wrong)."""
    code = ("static FcBool\nFcDirCacheProcess (FcConfig *c,\n\tFcBool (*callback) (int fd),"
            "\n\tvoid *closure)\n{\n\tobj_put (o);\n}\n")
    (tmp_path / "g.c").write_text(code)
    (site,) = sites.find_sites(tmp_path, "g.c", API.gets | API.puts)
    assert site.function == "FcDirCacheProcess"


def test_a_parenthesized_definition_names_its_function(tmp_path: Path) -> None:
    """GLib defines g_object_ref_sink as `(g_object_ref_sink) (gpointer o)` (its header
    has a macro of that name): the sites in it are its own, not the return type's."""
    (tmp_path / "f.c").write_text("gpointer\n(obj_sink) (gpointer o)\n{\n  obj_get (o);\n"
                                  "  return (o);\n}\n")
    found = sites.find_sites(tmp_path, "f.c", API.gets | API.puts)
    assert [(s.name, s.function) for s in found] == [("obj_get", "obj_sink")]
