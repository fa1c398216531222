"""Find kernel headers for bcc's run-time compile: the running kernel's, whole.

Debian splits a kernel's headers in two: `linux-headers-V-common` (kconfig.h and
the rest of include/) and `linux-headers-V-amd64` (the generated files of that
build), linked from `/lib/modules/V/source` and `/lib/modules/V/build`.  bcc
adds both halves only while BCC_KERNEL_SOURCE is unset; pointed at `build`
alone, its compile fails on kconfig.h (and libbcc 0.26 then crashes: see
program.py).  So the two halves are always merged, as a tree of symlinks in
refcntd's cache (CACHE_DIR/kernel-headers/NAME, never under /lib/modules), and
BCC_KERNEL_SOURCE names it.  The tree is made once per pair of header packages and
reused while its stamp names the same two halves (ready_tree): an interrupted or
stale one is rebuilt, never trusted.  Making it is ~16 000 symlinks: seconds on a
disk, half an hour on a VM's 9p share (benchmarks/kernels.py makes it on the host).

Headers of the running kernel come first; on a machine without them (this
project's 6.18 VM), the nearest older version of Debian's pairs in /usr/src,
and `Headers.why` says so (a version sort, not a string sort: `6.12` is newer
than `6.1.0`).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from refcntd import progress
from refcntd.errors import EnvironmentProblem
from refcntd.paths import CACHE_DIR

INSTALL_HINT = "install them with `apt-get install linux-headers-amd64`, or set BCC_KERNEL_SOURCE"
KCONFIG = Path("include/linux/kconfig.h")  # in -common: the half bcc loses when given -amd64
STAMP = ".refcntd-complete"  # written last in a merged tree: it names the two halves


@dataclass(frozen=True)
class Headers:
    """The tree BCC_KERNEL_SOURCE names, and why these headers (for `check` and notes)."""

    path: Path
    why: str  # how they were chosen; says so when they are not the running kernel's
    exact: bool  # the running kernel's own headers (or the user's BCC_KERNEL_SOURCE)


def find_kernel_source(src_root: Path = Path("/usr/src"), modules_root: Path = Path("/lib/modules"),
                       release: str | None = None, cache: Path = CACHE_DIR,
                       create: bool = True) -> Path:
    """A directory with kernel headers bcc can compile against (choose_headers)."""
    return choose_headers(src_root, modules_root, release, cache, create).path


def choose_headers(src_root: Path = Path("/usr/src"), modules_root: Path = Path("/lib/modules"),
                   release: str | None = None, cache: Path = CACHE_DIR,
                   create: bool = True) -> Headers:
    """The headers bcc compiles against.  create=False only names them: no merged tree
    is built (`refcntd check`)."""
    explicit = os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        return _explicit(Path(explicit))
    release = release or platform.release()
    own = _own_halves(modules_root / release)
    if own is not None:
        return Headers(_merge(*own, cache, create), f"the running kernel's ({release})", True)
    pairs = _debian_header_pairs(src_root)
    if not pairs:
        raise EnvironmentProblem(f"no kernel headers for {release} and no Debian "
                                 f"linux-headers-*-common/-amd64 pair in {src_root}", INSTALL_HINT)
    for common, arch in pairs:
        if arch.name == f"linux-headers-{release}":
            return Headers(_merge(common, arch, cache, create),
                           f"the running kernel's ({release})", True)
    common, arch = nearest_pair(pairs, release)
    why = (f"{arch.name[len('linux-headers-'):]}: no headers for the running kernel "
           f"{release} are installed; these are the nearest older version in {src_root}")
    return Headers(_merge(common, arch, cache, create), why, False)


def _explicit(path: Path) -> Headers:
    if not (path / "include").is_dir():
        raise EnvironmentProblem(f"BCC_KERNEL_SOURCE={path} has no include/ directory")
    if not (path / KCONFIG).is_file():
        raise EnvironmentProblem(
            f"BCC_KERNEL_SOURCE={path} has no {KCONFIG}: half of Debian's split headers "
            "(bcc's compile would fail)", "unset BCC_KERNEL_SOURCE: refcntd merges both "
            "halves itself, or point it at a complete tree")
    return Headers(path, "BCC_KERNEL_SOURCE", True)


def _own_halves(modules: Path) -> tuple[Path, Path] | None:
    """(source, build) of /lib/modules/RELEASE when `build` has include/: one tree
    twice when `build` is complete, Debian's two halves otherwise."""
    build, source = modules / "build", modules / "source"
    if not (build / "include").is_dir():
        return None
    if (build / KCONFIG).is_file() or not (source / KCONFIG).is_file():
        return build, build
    return source, build


def _debian_header_pairs(src_root: Path) -> list[tuple[Path, Path]]:
    """Every (common, amd64) pair of Debian header packages under `src_root`."""
    if not src_root.is_dir():
        return []
    pairs = []
    for arch in sorted(src_root.glob("linux-headers-*-amd64")):
        common = arch.with_name(arch.name[: -len("amd64")] + "common")
        if common.is_dir() and (arch / "include").is_dir():
            pairs.append((common, arch))
    return pairs


def version_key(text: str) -> tuple[int, ...]:
    """The numbers of a kernel release, in order: 6.12.117+deb12 -> (6, 12, 117, 12);
    6.1.0-56 -> (6, 1, 0, 56); compared as numbers, not strings."""
    return tuple(int(n) for n in re.findall(r"\d+", text))


def nearest_pair(pairs: list[tuple[Path, Path]], release: str) -> tuple[Path, Path]:
    """The pair with the newest version not newer than `release` (a kernel's headers
    rarely lose what an older kernel had), else the oldest one."""
    running = version_key(release)[:3]

    def version(pair: tuple[Path, Path]) -> tuple[int, ...]:
        return version_key(pair[1].name[len("linux-headers-"):])
    older = [p for p in pairs if version(p)[:3] <= running]
    return max(older, key=version) if older else min(pairs, key=version)


def _merge(common: Path, arch: Path, cache: Path, create: bool) -> Path:
    """`arch` itself when it is complete; else the merged tree of both halves.  A tree
    without kconfig.h is refused here, in one line: bcc's compile would fail on it."""
    if not (common / KCONFIG).is_file():
        raise EnvironmentProblem(f"the kernel headers in {common} have no {KCONFIG}: "
                                 "an incomplete tree", INSTALL_HINT)
    if common == arch:
        return arch
    common, arch = common.resolve(), arch.resolve()
    target = cache / "kernel-headers" / arch.name
    return _merged_tree(common, arch, target) if create else target


def _merged_tree(common: Path, arch: Path, target: Path) -> Path:
    """Symlink tree of `common` overlaid with `arch`, kept in the cache and reused while
    ready_tree() says so.  It is built beside the target and renamed into place, so an
    interrupted merge never leaves a tree that looks ready; one that is not is removed."""
    stamp = _stamp(common, arch)
    if ready_tree(target, stamp):
        return target
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    try:
        _remove_abandoned(target, stamp)
        with progress.stage("kernel headers: merging Debian's trees (once per cache)"):
            for tree in (common, arch):
                _link_tree(tree, partial)
        (partial / STAMP).write_text(stamp)
        _install(partial, target, stamp)
    except OSError as err:
        raise EnvironmentProblem(f"cannot build the merged kernel header tree in {target}: "
                                 f"{err.strerror}", "set REFCNTD_CACHE to a writable directory"
                                 ) from None
    return target


def _stamp(common: Path, arch: Path) -> str:
    return f"{common}\n{arch}\n"


def ready_tree(target: Path, stamp: str) -> bool:
    """A merged tree finished for exactly these halves (its stamp is written last),
    whose kconfig.h still leads to a file (the halves were not removed since)."""
    try:
        return (target / STAMP).read_text() == stamp and (target / KCONFIG).is_file()
    except (OSError, UnicodeDecodeError):
        return False


def _remove_abandoned(target: Path, stamp: str) -> None:
    """The target when it is not ready (an interrupted merge of an older refcntd, which
    built in place, or a tree of other halves), and partial trees whose merging process
    is gone."""
    if (target.exists() or target.is_symlink()) and not ready_tree(target, stamp):
        _remove(target)
    for partial in target.parent.glob(f"{target.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[1]
        if not pid.isdigit() or not _alive(int(pid)):
            _remove(partial)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _install(partial: Path, target: Path, stamp: str) -> None:
    """Rename the finished tree into place; if another process got there first with a
    ready tree, keep that one."""
    try:
        partial.rename(target)
    except OSError:
        if not ready_tree(target, stamp):
            raise
        shutil.rmtree(partial)


def _link_tree(src: Path, dst: Path) -> None:
    for root, _dirs, files in os.walk(src):
        out = dst / os.path.relpath(root, src)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            link = out / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path(root) / name)
