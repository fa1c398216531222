"""scripts/venv_current.py: setup.sh skips pip only when the venv has what pyproject asks."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

_spec = importlib.util.spec_from_file_location("venv_current", ROOT / "scripts/venv_current.py")
assert _spec is not None and _spec.loader is not None
venv_current = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(venv_current)


@pytest.mark.parametrize("old,new", [
    (None, None),  # pyproject as it is: current (setup.sh and this test made it so)
    ('"pytest-xdist>=3"', '"pytest-xdist>=999"'),  # a version the venv does not have
    ('"PyYAML>=6"', '"PyYAML>=6", "no-such-distribution-xyz"'),  # a distribution it lacks
    ('version = "0.1.0"', 'version = "0.1.1"'),  # refcntd's own version moved
])
def test_only_what_pyproject_asks_is_current(tmp_path, old, new):
    text = (ROOT / "pyproject.toml").read_text()
    if old is not None:
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "pyproject.toml").write_text(text)
    assert venv_current.current(tmp_path / "pyproject.toml", ROOT) == (old is None)


def test_an_install_from_another_checkout_is_not_current(tmp_path):
    assert not venv_current.current(ROOT / "pyproject.toml", tmp_path)
