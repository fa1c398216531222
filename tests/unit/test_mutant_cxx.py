"""benchmarks/mutants/runner: a C++ codebase (harfbuzz) keeps only the executed sites
whose call instructions are in their own function's code, and names that function
by its symbol (what refcntd names), not by the C scanner's guess (in a namespace, the
last function declared before it)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))

import harfbuzz  # noqa: E402
import runner  # noqa: E402
import sites  # noqa: E402

CODE = ("void hb_other (void);\nnamespace OT {\n"
        "struct face_t {\n  void fini ()\n  {\n    hb_blob_destroy (blob);\n"
        "  }\n};\n}\nvoid hb_thing_free (hb_thing_t *t)\n{\n  hb_set_destroy (t->set);\n}\n")


def rows_and_sites(tmp_path: Path) -> tuple[list[dict[str, object]], dict[str, sites.Site]]:
    (tmp_path / "hb-x.cc").write_text(CODE)
    found = sites.find_sites(tmp_path, "hb-x.cc", harfbuzz.GETS | harfbuzz.PUTS)
    by_key = {s.key: s for s in found}
    method, plain = sorted(by_key, key=lambda k: by_key[k].line)
    return [{"site": method, "hits": {"w": 1}, "symbol": "_ZN2OT6face_t4finiEv",
             "inlined": False},
            {"site": plain, "hits": {"w": 2}, "symbol": "hb_thing_free.part.0",
             "inlined": True}], by_key


def test_a_cxx_codebase_names_a_site_by_its_symbol_and_drops_inlined_copies(
        tmp_path: Path) -> None:
    rows, by_key = rows_and_sites(tmp_path)
    cb = dataclasses.replace(harfbuzz.codebase(tmp_path), source=tmp_path)
    kept = runner._kept(cb, by_key, rows)
    assert [(e.site.name, e.site.function) for e in kept] == [
        ("hb_blob_destroy", "_ZN2OT6face_t4finiEv")]


def test_a_c_codebase_keeps_every_site_with_the_scanners_name(tmp_path: Path) -> None:
    rows, by_key = rows_and_sites(tmp_path)
    cb = dataclasses.replace(harfbuzz.codebase(tmp_path), cxx=False)
    kept = runner._kept(cb, by_key, rows)
    assert [(e.site.name, e.site.function) for e in kept] == [
        ("hb_blob_destroy", "hb_other"),
        ("hb_set_destroy", "hb_thing_free")]
