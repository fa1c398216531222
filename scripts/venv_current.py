"""Exit 0 when .venv already has what pyproject.toml asks for, so scripts/setup.sh can
skip pip (whose resolve costs 7 s of CPU and a minute on a busy machine each time).

Current means: refcntd installed editable from this checkout at pyproject's version,
and every requirement of the project and of its `test` extra installed at a version
its specifier allows.  Anything else, or anything this cannot read, exits 1: pip runs.
Run by the venv's interpreter (packaging comes with the test extra).
"""

from __future__ import annotations

import json
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SITE = [sysconfig.get_path("purelib")]  # not a checkout's refcntd.egg-info on sys.path


def current(pyproject: Path = ROOT / "pyproject.toml", checkout: Path = ROOT) -> bool:
    """Whether this interpreter's environment has what `pyproject` asks, with refcntd
    installed editable from `checkout`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    try:
        (dist, *_) = metadata.distributions(name=project["name"], path=SITE)
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
        if dist.version != project["version"] or origin.get("url") != checkout.as_uri() \
                or not origin.get("dir_info", {}).get("editable"):
            return False
        for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate():
                continue
            (got, *_) = metadata.distributions(name=req.name, path=SITE)
            if not req.specifier.contains(got.version, prereleases=True):
                return False
    except ValueError:  # no such distribution installed
        return False
    return True


if __name__ == "__main__":
    try:
        sys.exit(0 if current() else 1)
    except Exception:  # noqa: BLE001 - unreadable or malformed: pip decides
        sys.exit(1)
