"""Rooms a newcomer can hold in their head: no class in refcntd/ is longer than
MAX_CLASS_LINES (issue 27; the kernel façade was one class of 657 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "refcntd"
MAX_CLASS_LINES = 350


def class_sizes() -> dict[str, int]:
    """Lines of every class in the package, by `path:Class`."""
    sizes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                key = f"{path.relative_to(PACKAGE.parent)}:{node.name}"
                sizes[key] = node.end_lineno - node.lineno + 1
    return sizes


def test_no_class_is_over_the_limit() -> None:
    sizes = class_sizes()
    assert len(sizes) > 50  # the walk found the package
    big = {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES}
    assert not big, f"split these classes by who calls them: {big}"
