"""Every option that writes, given what is not a regular file (issue 39): a character
device, a FIFO with a reader, a root-owned link to /proc/self/fd/1, `-`.  Each must
stay what it was and get the bytes; a link or FIFO nobody planted in a sticky
directory is still replaced, never written through.

The devices: a pseudo-terminal's slave (what refcntd writes there is read back from
its master side), and a private mknod of /dev/null's numbers.  Never the host's
/dev/null itself: a regression would replace it.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import stat
import subprocess
import tempfile
import threading
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REFCNTD, ROOT

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


class Terminal:
    """A character device (a pty's slave in /dev/pts: a copy made by mknod elsewhere
    does not open) whose bytes can be read back."""

    def __init__(self) -> None:
        self.master, slave = pty.openpty()
        tty.setraw(slave)  # no \n -> \r\n, no echo
        self.node = Path(os.ttyname(slave))
        self.slave = slave  # kept open: the terminal stays up between writers
        self.data = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk

    def text(self) -> str:
        os.close(self.slave)
        self.reader.join(timeout=10)
        os.close(self.master)
        return self.data.decode()


class Fifo:
    """A FIFO with a reader waiting on it, as `--json >(jq .)` or `mkfifo` give."""

    def __init__(self, where: Path) -> None:
        os.mkfifo(where)
        self.node = where
        self.data = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        with open(self.node, "rb") as f:
            self.data = f.read()

    def bytes(self) -> bytes:
        self.reader.join(timeout=60)
        assert not self.reader.is_alive(), "no writer ever closed the FIFO"
        return self.data

    def text(self) -> str:
        return self.bytes().decode()


@pytest.fixture()
def private(bpf, tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "out"
    where.mkdir(mode=0o700)
    yield where


def cli(args: list[str], env: dict[str, str] | None = None,
        stdin: int | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*REFCNTD, *args], capture_output=True, timeout=300, cwd=ROOT,
                          env=env, stdin=stdin)


def assert_same(node: Path, mode: int) -> None:
    assert stat.S_IFMT(os.lstat(node).st_mode) == stat.S_IFMT(mode), f"{node} was replaced"


def saved_run(build, where: Path) -> Path:
    """A real run of the demo with every writing option at a special file."""
    exe = build.perflike()
    dev, fifo, fifo2, summary = (Terminal(), Fifo(where / "sarif.fifo"),
                                 Fifo(where / "pprof.fifo"), Fifo(where / "summary.fifo"))
    link = where / "stdout-link"
    link.symlink_to("/proc/self/fd/1")
    env = dict(os.environ, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary.node))
    proc = cli(["run", "--json", str(dev.node), "--sarif", str(fifo.node), "--junit",
                str(link), "--pprof", str(fifo2.node), "--", str(exe)], env)
    assert proc.returncode == 23, proc.stderr.decode()
    for node, mode in ((dev.node, stat.S_IFCHR), (fifo.node, stat.S_IFIFO),
                       (fifo2.node, stat.S_IFIFO), (summary.node, stat.S_IFIFO),
                       (link, stat.S_IFLNK)):
        assert_same(node, mode)
    report = json.loads(dev.text())
    assert report["leaked_objects"] == 8
    assert json.loads(fifo.text())["runs"][0]["results"]
    assert b"<testsuite" in proc.stdout  # the junit, through the link to fd 1
    assert fifo2.bytes()[:2] == b"\x1f\x8b"  # gzip'd pprof
    assert "refcntd" in summary.text()
    saved = where / "run.json"
    saved.write_text(json.dumps(report))
    return saved


def test_run_writes_in_place_to_device_fifo_and_stdout_link(build, private):
    saved_run(build, private)


def test_run_json_dash_is_stdout(build, private):
    # CMD shares that standard output: its own lines go elsewhere here
    proc = cli(["run", "--json", "-", "--", "sh", "-c", f"exec {build.perflike()} >&2"])
    assert proc.returncode == 23, proc.stderr.decode()
    assert json.loads(proc.stdout)["leaked_objects"] == 8
    assert not (ROOT / "-").exists()


def test_report_output_to_special_files(build, private):
    saved = saved_run(build, private)
    dash = cli(["report", str(saved), "--format", "sarif", "--output", "-"])
    assert json.loads(dash.stdout)["runs"], dash.stderr.decode()
    dev = Terminal()
    assert cli(["report", str(saved), "--output", str(dev.node)]).returncode == 23
    assert_same(dev.node, stat.S_IFCHR)
    assert "8 objects of 3 types leaked" in dev.text()
    null = private / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert cli(["report", str(saved), "--format", "html", "--output", str(null)]
               ).returncode == 23
    assert_same(null, stat.S_IFCHR)
    fifo = Fifo(private / "report.fifo")
    assert cli(["report", str(saved), "--format", "pprof", "--output",
                str(fifo.node)]).returncode == 23
    assert fifo.bytes()[:2] == b"\x1f\x8b"
    assert_same(fifo.node, stat.S_IFIFO)
    link = private / "fd-link"
    link.symlink_to("/dev/stdout")
    through = cli(["report", str(saved), "--format", "junit", "--output", str(link)])
    assert b"<testsuite" in through.stdout
    assert_same(link, stat.S_IFLNK)


def test_spec_draft_output_to_fifo_and_dash(build, private):
    lib = build.stub_lib("O2")
    fifo = Fifo(private / "spec.fifo")
    assert cli(["spec", "draft", "--library", str(lib), "--output",
                str(fifo.node)]).returncode == 0
    assert "__refcnt__get" in fifo.text()
    assert_same(fifo.node, stat.S_IFIFO)
    dash = cli(["spec", "draft", "--library", str(lib), "--output", "-"])
    assert b"__refcnt__get" in dash.stdout
    assert not (ROOT / "-").exists()


@pytest.fixture()
def sticky(bpf) -> Iterator[Path]:
    """A sticky world-writable directory like /tmp, that nobody can reach."""
    shared = Path(tempfile.mkdtemp(prefix="refcntd-out-", dir="/tmp"))
    shared.chmod(0o1777)
    yield shared
    shutil.rmtree(shared)


def test_links_and_fifos_nobody_planted_are_replaced(build, private, sticky):
    saved = saved_run(build, private)
    secret = private / "secret"
    secret.write_text("root only\n")
    subprocess.run([*NOBODY, "ln", "-s", str(secret), str(sticky / "r.txt")], check=True)
    subprocess.run([*NOBODY, "mkfifo", "-m", "666", str(sticky / "r.fifo")], check=True)
    for name in ("r.txt", "r.fifo"):
        proc = cli(["report", str(saved), "--output", str(sticky / name)])
        assert proc.returncode == 23, proc.stderr.decode()
        assert stat.S_ISREG(os.lstat(sticky / name).st_mode)  # replaced, not followed
        assert "8 objects of 3 types leaked" in (sticky / name).read_text()
    assert secret.read_text() == "root only\n"
    # a link root made there (the directory's owner is root too) is followed
    ours = sticky / "ours"
    ours.symlink_to("/proc/self/fd/1")
    proc = cli(["report", str(saved), "--format", "junit", "--output", str(ours)])
    assert b"<testsuite" in proc.stdout and os.path.islink(ours)
