"""Running this checkout's refcntd as another user (`nobody`), wherever it was cloned.

A clone in root's home (/root is 0700 on Debian) or in any `mktemp -d` is a
place `nobody` cannot enter: the venv's interpreter, its packages and the
refcntd package are out of its reach, and a test that ran them as `nobody`
failed with "No module named refcntd" (issue 39, item 6).  Here they are
laid out where every user may enter: the refcntd package, its data (bpf/,
configs/) and the runtime distributions it requires, hard-linked (copied across file systems) into a
directory under /tmp, run by the system interpreter the venv was made from.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
from importlib import metadata
from pathlib import Path

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
PACKAGE = Path(__file__).resolve().parent.parent / "refcntd"


class OtherUserPython:
    """refcntd laid out for another user; `argv` runs `python -m refcntd` as that user
    sees it, with `env` (cwd: `root`)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="refcntd-other-user-", dir="/tmp"))
        self.root.chmod(0o755)
        for name in ("refcntd", "bpf", "configs"):  # the package and its data (paths.py)
            shutil.copytree(PACKAGE.parent / name, self.root / "src" / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        site = self.root / "site"
        for dist in _runtime_distributions("refcntd"):
            _link_files(dist, site)
        self.python = os.path.realpath(sys.executable)  # /usr/bin/python3.11, not .venv's
        self.env = {**os.environ, "PYTHONPATH": f"{site}:{self.root / 'src'}",
                    "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}
        self.argv = [self.python, "-m", "refcntd"]
        unreachable = _unreachable(self.root / "src" / "refcntd" / "__main__.py") or \
            _unreachable(Path(self.python))
        if unreachable:
            raise RuntimeError(f"{unreachable} cannot be entered by other users: refcntd "
                               "cannot be run as another user from here")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _runtime_distributions(name: str) -> list[metadata.Distribution]:
    """`name`'s required distributions, transitively, without extras (the test tools)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        for req in metadata.requires(todo.pop()) or []:
            if "extra ==" in req:
                continue
            dep = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]
            with contextlib.suppress(metadata.PackageNotFoundError):
                dist = metadata.distribution(dep)
                key = dist.metadata["Name"].lower()
                if key not in found:
                    found[key] = dist
                    todo.append(dep)
    return list(found.values())


def _link_files(dist: metadata.Distribution, site: Path) -> None:
    """The distribution's installed files, at the same relative paths under `site`."""
    for rel in dist.files or []:
        if ".." in rel.parts:
            continue  # scripts in bin/: not needed to import it
        source = Path(str(dist.locate_file(rel)))
        if not source.is_file():
            continue
        target = site / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.parent.chmod(0o755)
        if os.stat(source).st_mode & stat.S_IROTH:
            with contextlib.suppress(OSError):  # (another file system: copied)
                os.link(source, target)
                continue
        shutil.copy(source, target)
        target.chmod(0o755 if os.access(source, os.X_OK) else 0o644)


def _unreachable(path: Path) -> Path | None:
    """The first directory above `path` that other users cannot enter, if one is."""
    for parent in reversed(path.resolve().parents):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent
    return None
