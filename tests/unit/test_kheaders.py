"""The merged kernel header tree is refcntd's own per-kernel cache: a ready tree is
reused as it is, and an interrupted, stale or orphaned one is rebuilt, not trusted
(issue 40: under a VM's 9p share the merge takes half an hour; benchmarks/kernels.py
makes it on the host with this code, and the guest must take it as it is)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refcntd.kernel import kheaders
from refcntd.kernel.kheaders import KCONFIG, STAMP, choose_headers

RELEASE = "6.12.117+deb12-amd64"
GENERATED = Path("include/generated/autoconf.h")  # only in the -amd64 half


@pytest.fixture
def halves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Debian's two header packages of RELEASE under SRC: kconfig.h in -common, the
    generated files in -amd64."""
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    src = tmp_path / "src"
    common = src / "linux-headers-6.12.117+deb12-common"
    arch = src / f"linux-headers-{RELEASE}"
    for tree, name in ((common, KCONFIG), (arch, GENERATED)):
        (tree / name).parent.mkdir(parents=True)
        (tree / name).write_text("/* */\n")
    return src


def merge(src: Path, cache: Path) -> Path:
    return choose_headers(src, src / "no-modules", RELEASE, cache).path


def test_a_ready_tree_is_reused_as_it_is(halves, tmp_path):
    cache = tmp_path / "cache"
    tree = merge(halves, cache)
    assert (tree / KCONFIG).is_file() and (tree / GENERATED).is_file()
    mark = tree / "include" / "made-by-the-host"  # what a rebuild would not keep
    mark.write_text("")
    again = merge(halves, cache)
    assert again == tree and mark.exists()
    assert not list(tree.parent.glob("*.partial-*"))


def test_an_interrupted_merge_is_rebuilt_not_trusted(halves, tmp_path):
    """An older refcntd merged in place: an interrupted merge left links of the -common
    half and no stamp.  Taken as it is, bcc would miss the generated headers."""
    cache = tmp_path / "cache"
    target = cache / "kernel-headers" / f"linux-headers-{RELEASE}"
    common = halves / "linux-headers-6.12.117+deb12-common"
    (target / KCONFIG).parent.mkdir(parents=True)
    (target / KCONFIG).symlink_to(common / KCONFIG)
    (target / "include" / "left-over").symlink_to(tmp_path / "gone")
    tree = merge(halves, cache)
    assert tree == target and (tree / GENERATED).is_file()
    assert not (tree / "include" / "left-over").is_symlink()
    assert (tree / STAMP).read_text().splitlines() == [
        str(common.resolve()), str((halves / f"linux-headers-{RELEASE}").resolve())]


def test_a_merge_stopped_midway_leaves_no_tree_that_looks_ready(halves, tmp_path,
                                                                monkeypatch):
    cache = tmp_path / "cache"
    real = kheaders._link_tree
    calls = []

    def stop_after_the_first_half(src: Path, dst: Path) -> None:
        calls.append(src)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C, or a VM's timeout, mid-merge
        real(src, dst)
    monkeypatch.setattr(kheaders, "_link_tree", stop_after_the_first_half)
    with pytest.raises(KeyboardInterrupt):
        merge(halves, cache)
    target = cache / "kernel-headers" / f"linux-headers-{RELEASE}"
    assert not target.exists()
    monkeypatch.setattr(kheaders, "_link_tree", real)
    tree = merge(halves, cache)
    assert (tree / KCONFIG).is_file() and (tree / GENERATED).is_file()


def test_a_tree_of_other_halves_is_rebuilt(halves, tmp_path):
    """The stamp names the halves' real paths: a tree made from another copy of the
    headers (another root, a moved package) is not this one."""
    cache = tmp_path / "cache"
    tree = merge(halves, cache)
    (tree / STAMP).write_text("/elsewhere/common\n/elsewhere/amd64\n")
    (tree / "include" / "stale").write_text("")
    assert merge(halves, cache) == tree
    assert not (tree / "include" / "stale").exists()
    assert str(halves.resolve()) in (tree / STAMP).read_text()


def test_a_tree_whose_headers_were_removed_is_not_ready(halves, tmp_path):
    tree = merge(halves, tmp_path / "cache")
    stamp = (tree / STAMP).read_text()
    assert kheaders.ready_tree(tree, stamp)
    (halves / "linux-headers-6.12.117+deb12-common" / KCONFIG).unlink()
    assert not kheaders.ready_tree(tree, stamp)


def test_partial_trees_of_finished_processes_are_removed(halves, tmp_path):
    finished = subprocess.Popen(["true"])
    finished.wait()
    parent = tmp_path / "cache" / "kernel-headers"
    orphan = parent / f"linux-headers-{RELEASE}.partial-{finished.pid}"
    (orphan / "include").mkdir(parents=True)
    merge(halves, tmp_path / "cache")
    assert not orphan.exists()
