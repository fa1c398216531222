"""Paths through /proc/PID/root (refcntd/inputs/rootpaths.py), on a fixture /proc: a
process whose root is another directory, in another mount namespace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refcntd.inputs.rootpaths import beside, resolve, seen_inside, split_root


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """/proc with `self` (mount ns 1, root `ours`) and 42 (mount ns 2, root `host`), whose
    /usr/local/bin/prog is a link to /opt/prog/bin/prog, an absolute link that must
    resolve inside `host`, never in `ours`."""
    ours, host = tmp_path / "ours", tmp_path / "host"
    (host / "opt/prog/bin").mkdir(parents=True)
    (host / "opt/prog/bin/prog").write_bytes(b"\x7fELF")
    (host / "usr/local/bin").mkdir(parents=True)
    (host / "usr/local/bin/prog").symlink_to("/opt/prog/bin/prog")
    (host / "lib64").symlink_to("usr/lib")  # a relative link
    (host / "usr/lib").mkdir()
    (host / "usr/lib/up").symlink_to("../../../../etc")
    ours.mkdir()
    proc = tmp_path / "proc"
    for pid, ns, root in (("self", "mnt:[1]", ours), ("42", "mnt:[2]", host),
                          ("7", "mnt:[1]", ours)):
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "ns" / "mnt").symlink_to(ns)
        (proc / pid / "root").symlink_to(root)
    return proc


def test_a_foreign_root_keeps_its_prefix_and_resolves_links_inside_it(proc: Path):
    prefix = f"{proc}/42/root"
    assert split_root(f"{prefix}/usr/local/bin/prog", proc) == (prefix, "/usr/local/bin/prog")
    assert resolve(f"{prefix}/usr/local/bin/prog", proc) == f"{prefix}/opt/prog/bin/prog"
    assert resolve(f"{prefix}/lib64/../lib64/x.so", proc) == f"{prefix}/usr/lib/x.so"
    # a link's `..` never leaves the root, as in the kernel's walk from that root
    assert resolve(f"{prefix}/usr/lib/up/passwd", proc) == f"{prefix}/etc/passwd"
    assert resolve(prefix, proc) == prefix + "/"
    # what the kernel reports for that root's processes: the path inside it
    assert seen_inside(resolve(f"{prefix}/usr/local/bin/prog", proc), proc) == \
        "/opt/prog/bin/prog"


def test_our_own_root_under_another_pid_is_a_plain_path(proc: Path, tmp_path: Path):
    """Same mount namespace, same root directory: the prefix names our root."""
    path = f"{proc}/7/root/usr/bin/x"
    assert split_root(path, proc) == ("", path)
    assert split_root(f"{proc}/self/root/etc", proc)[0] == ""
    assert resolve("/usr/bin/../bin", proc) == os.path.realpath("/usr/bin")


def test_a_root_that_cannot_be_read_is_foreign(proc: Path):
    """A pid that is gone (or whose links are refused): the prefix is kept, and opening
    the file through it later says why."""
    assert split_root(f"{proc}/99/root/usr/bin/x", proc) == (f"{proc}/99/root", "/usr/bin/x")


def test_beside_names_a_path_in_the_root_of_another(proc: Path):
    """A PT_INTERP, a RUNPATH directory or an exe the kernel reported, taken in the root
    of the program it belongs to."""
    prefix = f"{proc}/42/root"
    assert beside(f"{prefix}/usr/local/bin/prog", "/usr/local/bin/prog", proc) == \
        f"{prefix}/opt/prog/bin/prog"
    assert beside(f"{prefix}/x", "/lib64/ld.so", proc) == f"{prefix}/usr/lib/ld.so"
    assert beside(f"{prefix}/x", f"{proc}/42/root/lib64", proc) == f"{prefix}/usr/lib"
    assert beside("/usr/bin/env", "/usr/bin/../bin", proc) == os.path.realpath("/usr/bin")


def test_libraries_of_a_program_in_another_root_are_found_in_that_root(tmp_path: Path,
                                                                        monkeypatch):
    """resolve_library for a program named through a foreign root looks in that root's
    directories, never in ours (where another libc of that name lives)."""
    from refcntd.binary import libpaths
    root = tmp_path / "host"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libonlythere.so.1").write_bytes(b"\x7fELF")
    monkeypatch.setattr(libpaths, "split_root", lambda p: (str(root), str(p)))
    monkeypatch.setattr(libpaths, "beside", lambda like, p: str(root) + p)
    monkeypatch.setattr(libpaths, "_ldconfig_dirs", lambda r: [])

    class Exe:
        path = root / "usr/bin/prog"

        def runpaths(self) -> list[str]:
            return []
    found = libpaths.resolve_library("libonlythere.so.1", Exe())  # type: ignore[arg-type]
    assert found == f"{root}/usr/lib/x86_64-linux-gnu/libonlythere.so.1"


def test_serve_takes_an_exec_reported_by_the_kernel_in_its_target_s_root(monkeypatch):
    """The kernel reports a host process's exe as the host names it (/usr/local/bin/x);
    a target `path: /proc/42/root/usr/local/bin/*` attaches that file through the root,
    and a target of our own root does not take it."""
    from refcntd.inputs.config import Target
    from refcntd.inputs.spec import load_spec
    from refcntd.service import targets as targets_module
    from refcntd.service.metrics import TargetStats
    monkeypatch.setattr(targets_module, "split_root", lambda p: (
        ("/proc/42/root", p[len("/proc/42/root"):]) if p.startswith("/proc/42/") else ("", p)))
    monkeypatch.setattr(targets_module, "beside", lambda like, p: "/proc/42/root" + p)
    attached: list[tuple[str, str]] = []
    monkeypatch.setattr(targets_module.Targets, "_attach_binary",
                        lambda self, rt, path: attached.append((rt.target.name, path)))
    monkeypatch.setattr(targets_module, "file_stamp", lambda p: None)
    monkeypatch.setattr(targets_module, "file_identity", lambda p: None)
    spec = load_spec("perf-stubs")
    targets = targets_module.Targets(lambda *a: None, lambda t: None)
    for name, path in (("host", "/proc/42/root/usr/local/bin/*"), ("own", "/opt/*")):
        target = Target(name, path, spec)
        targets.runtimes[name] = targets_module.TargetRuntime(
            target, TargetStats(name, 1.0, 10, 0.0))
    targets.on_exec(100, "/usr/local/bin/prog")
    targets.on_exec(101, "/opt/tool")
    assert attached == [("host", "/proc/42/root/usr/local/bin/prog"), ("own", "/opt/tool")]
