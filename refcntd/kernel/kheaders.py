"""Find kernel headers for bcc's run-time compile.

Debian has no headers package for every kernel; the generic
linux-headers-amd64 works for uprobe programs once its `-common` and `-amd64`
trees are merged.  We build that merge as a tree of symlinks in a cache
directory (never under /lib/modules) and point BCC_KERNEL_SOURCE at it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from refcntd import progress
from refcntd.errors import EnvironmentProblem
from refcntd.paths import CACHE_DIR

INSTALL_HINT = "install them with `apt-get install linux-headers-amd64`, or set BCC_KERNEL_SOURCE"


def find_kernel_source(src_root: Path = Path("/usr/src"), modules_root: Path = Path("/lib/modules"),
                       release: str | None = None, cache: Path = CACHE_DIR,
                       create: bool = True) -> Path:
    """A directory with kernel headers bcc can compile against.

    create=False only names it: a merged tree is not built (`refcntd check`).
    """
    explicit = os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        if not (Path(explicit) / "include").is_dir():
            raise EnvironmentProblem(f"BCC_KERNEL_SOURCE={explicit} has no include/ directory")
        return Path(explicit)
    release = release or platform.release()
    build = modules_root / release / "build"
    if (build / "include").is_dir():
        return build
    pair = _debian_header_pair(src_root)
    if pair is None:
        raise EnvironmentProblem(f"no kernel headers for {release} and no Debian "
                                 f"linux-headers-*-common/-amd64 pair in {src_root}", INSTALL_HINT)
    if not create:
        return cache / "kernel-headers" / pair[1].name
    return _merged_tree(*pair, cache)


def _debian_header_pair(src_root: Path) -> tuple[Path, Path] | None:
    if not src_root.is_dir():
        return None
    arch_trees = sorted(src_root.glob("linux-headers-*-amd64"), reverse=True)
    for arch in arch_trees:
        common = arch.with_name(arch.name[: -len("amd64")] + "common")
        if common.is_dir() and (arch / "include").is_dir():
            return common, arch
    return None


def _merged_tree(common: Path, arch: Path, cache: Path) -> Path:
    """Symlink tree of `common` overlaid with `arch`; rebuilt only when missing."""
    target = cache / "kernel-headers" / arch.name
    stamp = target / ".refcntd-complete"
    if stamp.exists():
        return target
    try:
        with progress.stage("kernel headers: merging Debian's trees (once per cache)"):
            for tree in (common, arch):
                _link_tree(tree, target)
        stamp.write_text(f"{common}\n{arch}\n")
    except OSError as err:
        raise EnvironmentProblem(f"cannot build the merged kernel header tree in {target}: "
                                 f"{err.strerror}", "set REFCNTD_CACHE to a writable directory"
                                 ) from None
    return target


def _link_tree(src: Path, dst: Path) -> None:
    for root, _dirs, files in os.walk(src):
        out = dst / os.path.relpath(root, src)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            link = out / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path(root) / name)
