"""inputs/safefs.py on files this user makes: every refusal is one line and nothing hangs.

tests/bpf/test_safefs_root.py repeats the attacks as root with the files made
by a process running as `nobody`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_input_files import alarm  # noqa: F401 - a fixture: a FIFO waited on fails

from refcntd.errors import InputFileError
from refcntd.inputs.safefs import (
    UntrustedFileError,
    atomic_write,
    open_untrusted,
    trusted_dir,
)


def refusal(path: Path, **how: object) -> str:
    with pytest.raises(UntrustedFileError) as err:
        open_untrusted(path, 1 << 20, what="perf map", **how).close()  # type: ignore[arg-type]
    assert isinstance(err.value, InputFileError)
    assert err.value.line().count("\n") == 0
    return err.value.message


def test_regular_file_is_read(tmp_path):
    path = tmp_path / "perf-1.map"
    path.write_bytes(b"1000 10 jit\n")
    with open_untrusted(path, 100, owners={os.geteuid()}) as f:
        assert f.read_all() == b"1000 10 jit\n"


@pytest.mark.usefixtures("alarm")
def test_fifo_directory_and_device_are_refused_without_waiting(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert refusal(fifo) == f"perf map {fifo}: is a FIFO, not a regular file"
    assert refusal(tmp_path).endswith("is a directory, not a regular file")
    assert refusal(Path("/dev/null")).endswith("is a character device, not a regular file")
    assert refusal(tmp_path / "absent").endswith("no such file")


def test_symbolic_links_are_not_followed_unless_asked(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("secret")
    (tmp_path / "last").symlink_to(secret)
    (tmp_path / "dir").symlink_to(tmp_path)
    assert refusal(tmp_path / "last").endswith("not followed")
    assert refusal(tmp_path / "dir" / "secret").endswith("a symbolic link in its path, "
                                                         "not followed")
    with open_untrusted(tmp_path / "dir" / "last", 100, follow_symlinks=True) as f:
        assert f.read_all() == b"secret"


def test_size_cap_also_for_a_file_that_grows_while_read(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(UntrustedFileError, match=r"too big \(101 bytes; at most 100\)"):
        open_untrusted(path, 100)
    path.write_bytes(b"x" * 100)
    with open_untrusted(path, 100) as f:
        with path.open("ab") as grow:
            grow.write(b"more")
        with pytest.raises(UntrustedFileError, match="too big"):
            f.read_all()


def test_owner_must_be_one_of_the_allowed_uids(tmp_path):
    path = tmp_path / "perf-2.map"
    path.write_text("")
    other = os.geteuid() + 1
    assert refusal(path, owners={other}) == (f"perf map {path}: owned by uid {os.geteuid()}, "
                                             f"not by uid {other}")
    open_untrusted(path, 10, owners={0, os.geteuid()}).close()


def test_fd_path_reads_the_checked_file_not_what_replaced_it(tmp_path):
    path = tmp_path / "lib.so"
    path.write_text("checked")
    with open_untrusted(path, 100) as f:
        path.unlink()
        path.symlink_to("/etc/passwd")
        assert Path(f.fd_path).read_text() == "checked"


def test_inside_a_root_no_link_leads_out(tmp_path):
    """A container's root: absolute links and .. resolve inside it, never on the host."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("the container's")
    (root / "lib").mkdir()
    (root / "lib" / "abs").symlink_to("/etc/passwd")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        with open_untrusted("/lib/abs", 100, root_fd=fd, follow_symlinks=True) as f:
            assert f.read_all() == b"the container's"
        with open_untrusted("/../../../etc/passwd", 100, root_fd=fd) as f:
            assert f.read_all() == b"the container's"
        with pytest.raises(UntrustedFileError, match="symbolic link"):
            open_untrusted("/lib/abs", 100, root_fd=fd)
    finally:
        os.close(fd)


def test_trusted_dir_owner_and_modes(tmp_path):
    assert trusted_dir("/") is None and trusted_dir("/usr/lib") is None
    mine = tmp_path / "cache"
    mine.mkdir(mode=0o755)
    assert trusted_dir(mine) is None  # /tmp above it is sticky: accepted
    mine.chmod(0o775)
    assert trusted_dir(mine) == f"{mine} is writable by group or others"
    mine.chmod(0o1777)  # sticky is not enough for the directory itself
    assert trusted_dir(mine) == f"{mine} is writable by group or others"
    inner = mine / "inner"
    inner.mkdir(mode=0o700)
    assert trusted_dir(inner) is None  # under a sticky parent
    mine.chmod(0o777)
    assert trusted_dir(inner) == f"{mine} is writable by group or others"
    assert trusted_dir(tmp_path / "absent") == f"{tmp_path / 'absent'}: no such file"


def test_trusted_dir_checks_where_links_lead(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    (loose / "real").mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(loose / "real")
    assert trusted_dir(tmp_path / "link") == f"{loose} is writable by group or others"
    loose.chmod(0o755)
    assert trusted_dir(tmp_path / "link") is None


def test_atomic_write_replaces_a_planted_link_never_follows_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    target = tmp_path / "cache.cfi"
    target.symlink_to(victim)
    atomic_write(target, b"new", 0o600)
    assert victim.read_text() == "untouched"
    assert not target.is_symlink() and target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.cfi", "victim"]


def test_atomic_write_failure_leaves_no_temporary_file(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        atomic_write(tmp_path / "taken", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]


def test_a_file_mostly_holes_is_refused_by_both_readers(tmp_path):
    """A 1 GiB file with 4 KiB written (a hole: no disk) is refused, with its sizes, by
    open_untrusted and by the binary reader; the same size written densely is not
    refused for its holes (only by the size cap where there is one)."""
    from refcntd.inputs.files import read_bytes
    from refcntd.inputs.safefs import ELF_LIMIT, UntrustedFileError, open_untrusted

    hollow = tmp_path / "hollow.so"
    with open(hollow, "wb") as f:
        f.write(b"\x7fELF" + b"\0" * 4092)
        f.truncate(1 << 30)
    with pytest.raises(UntrustedFileError, match=r"mostly holes \(1073741824 bytes, "):
        open_untrusted(hollow, ELF_LIMIT)
    with pytest.raises(InputFileError, match="mostly holes"):
        read_bytes(hollow, "binary", limit=None)
    dense = tmp_path / "dense"
    dense.write_bytes(b"x" * (300 << 20))
    open_untrusted(dense, ELF_LIMIT).close()


def test_a_process_s_own_names_are_opened_as_its_own():
    from refcntd.kernel.decode import process_path

    assert process_path("/proc/self/fd/9", 42) == "/proc/42/fd/9"
    assert process_path("/proc/thread-self/fd/3", 42) == "/proc/42/fd/3"
    assert process_path("/dev/fd/5", 42) == "/proc/42/fd/5"
    assert process_path("/usr/lib/libz.so.1", 42) == "/usr/lib/libz.so.1"
