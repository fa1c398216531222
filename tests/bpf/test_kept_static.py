"""A valgrind entry naming static functions matches a stripped program's stack only
where debug symbols name those frames (a -dbgsym file by build-id), as Debian's
stripped libraries need; without them the frames are `???` and nothing is kept."""

from __future__ import annotations

import shutil

from conftest import refcntd
from test_symbols import run_env, stripped  # noqa: F401  (the fixture)

from refcntd.binary.elf import read_build_id

SUPP = """\
{
   gadgets-built-at-start
   Memcheck:Leak
   fun:calloc
   fun:gadget_create
   fun:assemble_parts
   fun:build_all
}
"""


def kept_spec(tmp_path, spec):
    (tmp_path / "gadgets.supp").write_text(SUPP)
    kept = tmp_path / "kept-spec.yaml"
    kept.write_text(spec.read_text() + "kept_by_library:\n"
                    f"  - {{valgrind: {tmp_path / 'gadgets.supp'}, reason: built at start}}\n")
    return kept


def test_static_names_match_only_with_debug_symbols(bpf, stripped, tmp_path):  # noqa: F811
    prog, debug, spec = stripped
    spec = kept_spec(tmp_path, spec)
    bare = refcntd(["run", "--spec", str(spec), "--", str(prog)], tmp_path / "bare.json",
                   env=run_env(tmp_path))
    (process,) = bare.report["processes"]
    assert process["leaked_objects"] == 2 and process["kept_by_library"] == {}, bare.stderr

    build_id = read_build_id(prog)
    root = tmp_path / "debugroot"
    target = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    target.parent.mkdir(parents=True)
    shutil.copy(debug, target)
    named = refcntd(["run", "--spec", str(spec), "--", str(prog)], tmp_path / "named.json",
                    env=run_env(tmp_path, REFCNTD_DEBUG_DIRS=str(root)))
    (process,) = named.report["processes"]
    assert process["leaked_objects"] == 0, named.stderr
    assert process["kept_by_library"] == {
        "built at start (gadgets.supp: 1 of 1 entries used: gadgets-built-at-start x2; "
        "0 unused)": 2}, named.stderr
    assert named.returncode == 0, named.stderr
