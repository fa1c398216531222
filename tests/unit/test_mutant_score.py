"""benchmarks/mutants/score.plain: a culprit named by one of gcc's clones of the mutated
function is that function (the clone kinds refcntd's own symbolizer knows,
refcntd/binary/elf.CLONE_RE).  GLib's recursive g_variant_print_string is called
through its `.localalias` in a -fPIC build: a right answer was scored wrong."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "mutants"))

import score  # noqa: E402


def test_every_clone_kind_is_the_function_itself() -> None:
    for name in ("f.part.0", "f.isra.0", "f.constprop.0.isra.0", "f.cold", "f.lto_priv.0",
                 "f.localalias"):
        assert score.plain(name) == "f"
    assert score.plain("f_localalias") == "f_localalias"
