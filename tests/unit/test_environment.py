"""The test venv holds exactly what pyproject.toml asks for, from PyPI, whatever Debian
has installed.

A venv that saw Debian's site (``--system-site-packages``) took Debian's untyped
pyelftools 0.29 as satisfying ``pyelftools>=0.29``, and ``mypy --strict`` then failed on
a fresh machine although CI passed on an older one. setup.sh installs that Debian
package on purpose, so this check meets the trap on every machine.
"""

import importlib.metadata
import sys
import sysconfig
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_SITE = Path("/usr/lib/python3/dist-packages")


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + project["optional-dependencies"]["test"]
    return [Requirement(r) for r in listed]


def test_no_debian_site_on_the_path():
    assert str(DEBIAN_SITE) not in sys.path
    cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg


def test_every_requirement_is_installed_in_the_venv_at_its_version():
    venv_site = Path(sysconfig.get_path("purelib")).resolve()
    for req in requirements():
        dist = importlib.metadata.distribution(req.name)
        where = Path(str(dist.locate_file(""))).resolve()
        assert where == venv_site, f"{req.name} comes from {where}, not the venv"
        assert req.specifier.contains(dist.version, prereleases=True), (req, dist.version)


def test_pyelftools_is_typed():
    """mypy --strict needs the py.typed marker that Debian's 0.29 lacks."""
    import elftools

    assert (Path(elftools.__file__).parent / "py.typed").exists()


def test_bcc_is_debians_own_package():
    import bcc

    assert Path(bcc.__file__).resolve().is_relative_to(DEBIAN_SITE)
