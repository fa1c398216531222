"""inputs/safefs.py as refcntd uses it: root reading and writing where `nobody` plants
files.  No BPF, but root: skipped without it, failed under REFCNTD_REQUIRE_BPF=1.

The attacker is a real process running as nobody (setpriv), in a sticky
world-writable directory like /tmp.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from refcntd.inputs.safefs import UntrustedFileError, atomic_write, open_untrusted, trusted_dir

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture()
def root() -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("REFCNTD_REQUIRE_BPF") == "1":
        pytest.fail("root required (REFCNTD_REQUIRE_BPF=1)")
    pytest.skip("needs root")


@pytest.fixture()
def shared(root: None) -> Iterator[Path]:
    """A sticky world-writable directory (/tmp's modes) that nobody can reach."""
    path = Path(tempfile.mkdtemp(prefix="refcntd-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    for _ in range(10):  # a killed attacker's last rename may still land
        try:
            shutil.rmtree(path)
            return
        except OSError:
            time.sleep(0.1)
    shutil.rmtree(path)


@pytest.fixture()
def secret(root: None) -> Iterator[Path]:
    """A file only root may read."""
    fd, name = tempfile.mkstemp(prefix="refcntd-secret-")
    os.write(fd, b"root only\n")
    os.close(fd)
    os.chmod(name, 0o600)
    yield Path(name)
    os.unlink(name)


def as_nobody(script: str) -> None:
    subprocess.run([*NOBODY, "sh", "-c", script], check=True, timeout=30)


def nobody_uid() -> int:
    return pwd.getpwnam("nobody").pw_uid


def test_fifo_planted_by_nobody_is_refused_at_once(shared):
    as_nobody(f"mkfifo {shared}/perf-1.map")
    started = time.monotonic()
    with pytest.raises(UntrustedFileError, match="is a FIFO, not a regular file"):
        open_untrusted(shared / "perf-1.map", 1 << 20, owners={0, nobody_uid()})
    assert time.monotonic() - started < 1


def test_link_to_a_root_only_file_is_not_read(shared, secret):
    as_nobody(f"ln -s {secret} {shared}/perf-2.map")
    with pytest.raises(UntrustedFileError, match="is a symbolic link, not followed"):
        open_untrusted(shared / "perf-2.map", 1 << 20, owners={0, nobody_uid()})


def test_file_of_another_user_is_refused_by_owner(shared):
    as_nobody(f"echo '1000 10 fake' > {shared}/perf-3.map")
    with pytest.raises(UntrustedFileError, match=f"owned by uid {nobody_uid()}, not by uid 0"):
        open_untrusted(shared / "perf-3.map", 1 << 20, owners={0})
    with open_untrusted(shared / "perf-3.map", 1 << 20, owners={0, nobody_uid()}) as f:
        assert f.read_all() == b"1000 10 fake\n"


def test_swapping_attacker_never_stalls_or_leaks(shared, secret):
    """nobody swaps the name between a file, a FIFO and a link to a root-only file as
    fast as it can while root opens it: every open ends at once, the secret never shows."""
    target = shared / "perf-4.map"
    loop = (f"while :; do echo 1 > {target}.f; mv -f {target}.f {target}; "
            f"mkfifo {target}.p; mv -f {target}.p {target}; "
            f"ln -sf {secret} {target}.l; mv -f {target}.l {target}; done")
    # its own process group: killing sh alone left a running mv or mkfifo to create
    # a file while the fixture removed the directory (seen once under load)
    attacker = subprocess.Popen([*NOBODY, "sh", "-c", loop], start_new_session=True)
    seen: set[str] = set()
    try:
        started = time.monotonic()
        while time.monotonic() - started < 3:
            try:
                with open_untrusted(target, 100, owners={0, nobody_uid()}) as f:
                    data = f.read_all()
                assert b"root only" not in data
                seen.add("read")
            except UntrustedFileError as err:
                seen.add(err.message.split(": ", 1)[1])
    finally:
        os.killpg(attacker.pid, signal.SIGKILL)
        attacker.wait()
    assert "read" in seen and "is a FIFO, not a regular file" in seen, seen


def test_trusted_dir_refuses_what_nobody_owns_or_may_write(shared):
    as_nobody(f"mkdir -m 755 {shared}/theirs")
    assert trusted_dir(shared / "theirs") == f"{shared}/theirs is owned by uid {nobody_uid()}, " \
                                             "not root"
    mine = shared / "mine"
    mine.mkdir(mode=0o755)
    assert trusted_dir(mine) is None  # nobody cannot rename or remove it: sticky parent
    as_nobody(f"ln -s {mine} {shared}/link")
    assert trusted_dir(shared / "link") == f"{shared}/link is owned by uid {nobody_uid()}, " \
                                           "not root"


def test_atomic_write_over_a_link_planted_by_nobody(root, secret):
    """A cache directory nobody may write into (misconfigured): the planted link at the
    cache file's name is replaced, the root-only file it named is untouched."""
    cache = Path(tempfile.mkdtemp(prefix="refcntd-cache-"))
    try:
        cache.chmod(0o777)
        as_nobody(f"ln -s {secret} {cache}/table.cfi")
        atomic_write(cache / "table.cfi", b"table", 0o644)
        assert secret.read_bytes() == b"root only\n"
        assert not (cache / "table.cfi").is_symlink()
        assert (cache / "table.cfi").read_bytes() == b"table"
        assert (cache / "table.cfi").stat().st_uid == 0
    finally:
        shutil.rmtree(cache)
