"""Every input file goes through inputs/files.py: one line naming it, exit 2, no hang."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.cli.main import main
from refcntd.outputs import reportjson

BAD_KINDS = {
    "latin1": ("not UTF-8 text (byte 0xe9 at offset 6)",
               lambda p: p.write_bytes(b"name: \xe9t\xe9\n")),
    "fifo": ("is a FIFO", lambda p: os.mkfifo(p)),
    "directory": ("is a directory", lambda p: p.mkdir()),
    "missing": ("no such file", lambda p: None),
    "garbage": ("", lambda p: p.write_text("{[ not : valid\n\x00")),
}


def saved_run(path: Path) -> Path:
    process = ProcessReport(1, "x", [], "exited")
    reportjson.write_json(RunResult("run", "perf-stubs", "x", [process]), str(path))
    return path


def slots(tmp: Path, bad: Path) -> dict[str, list[str]]:
    """Each input-file slot of every command, with the bad file in it."""
    good = str(saved_run(tmp / "good.json"))
    return {
        "check --spec": ["check", "--binary", "/bin/true", "--spec", f"{bad}.yaml"],
        "check --binary": ["check", "--binary", str(bad)],
        "run --spec": ["run", "--spec", f"{bad}.yaml", "--", "/bin/true"],
        "run --suppressions": ["run", "--suppressions", str(bad), "--", "/bin/true"],
        "run --baseline": ["run", "--baseline", str(bad), "--", "/bin/true"],
        "report RUN.json": ["report", str(bad)],
        "report --baseline": ["report", good, "--baseline", str(bad)],
        "report --suppressions": ["report", good, "--suppressions", str(bad)],
        "serve --config": ["serve", "--check", "--config", str(bad)],
        "attach --spec": ["attach", "--binary", "/bin/true", "--spec", f"{bad}.yaml"],
    }


@pytest.fixture
def alarm() -> Iterator[None]:
    """A FIFO read that blocks would hang the suite: fail it after 10 s instead."""
    def fire(*_: object) -> None:
        raise TimeoutError("blocked on an input file")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("kind", sorted(BAD_KINDS))
def test_bad_input_file_one_line(kind: str, tmp_path: Path, alarm: None,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    needle, make = BAD_KINDS[kind]
    bad = tmp_path / "input"
    for slot, argv in slots(tmp_path, bad).items():
        target = Path(argv[argv.index(f"{bad}.yaml")]) if f"{bad}.yaml" in argv else bad
        make(target)
        assert main(argv) == 2, slot
        err = capsys.readouterr().err
        lines = err.splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (slot, err)
        binary_text = slot == "check --binary" and "not an ELF file" in lines[0]
        assert target.name in lines[0] and (needle in lines[0] or binary_text), (slot, lines[0])
        _remove(target)


def _remove(path: Path) -> None:
    if path.is_dir():
        path.rmdir()
    elif path.exists() or path.is_fifo():
        path.unlink()


def test_too_big_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: nothing is written
    assert main(["check", "--binary", "/bin/true", "--spec", str(big)]) == 2
    assert "too big" in capsys.readouterr().err


def test_file_stamp_tells_versions_and_files_apart(tmp_path: Path) -> None:
    """file_stamp is the one stat of a file's identity: a rewrite keeps the (device,
    inode) identity and changes the stamp; a replacement changes both; the kernel's
    dev_t is MAJOR << 20 | MINOR (what BPF compares with the maps' FileKey)."""
    from refcntd.inputs.files import file_identity, file_stamp
    path = tmp_path / "lib.so"
    path.write_bytes(b"1")
    first = file_stamp(path)
    assert first is not None and file_identity(path) == first.identity
    path.write_bytes(b"22")
    assert file_stamp(path) != first and file_identity(path) == first.identity
    (tmp_path / "new.so").write_bytes(b"1")
    keep = path.open("rb")  # the old inode stays in use: the new file cannot reuse it
    os.replace(tmp_path / "new.so", path)
    assert file_identity(path) != first.identity
    keep.close()
    st = os.stat(path)
    assert file_stamp(path).kernel_dev == os.major(st.st_dev) << 20 | os.minor(st.st_dev)
    assert file_stamp(tmp_path / "gone") is None and file_identity(tmp_path / "gone") is None
