"""inputs/outputfile.py: which outputs are replaced and which are written in place.

tests/bpf/test_output_paths.py writes through every CLI option to real devices,
FIFOs and links as root; these check the resolution rules on files this user makes.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import pytest

from refcntd.inputs.outputfile import destination, output_file, write_output


def test_dash_and_stdout_links_are_our_descriptors():
    assert destination("-").fd == 1
    for name in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "/proc/thread-self/fd/1"):
        where = destination(name)
        assert (where.kind, where.fd) == ("fd", 1), name
    assert destination("/dev/stderr").fd == 2


def test_regular_missing_and_devices(tmp_path):
    (tmp_path / "old.json").write_text("{}")
    assert destination(str(tmp_path / "old.json")).kind == "file"
    assert destination(str(tmp_path / "new.json")).kind == "file"
    null = destination("/dev/null")
    assert null.kind == "special" and stat.S_ISCHR(null.mode)
    with pytest.raises(IsADirectoryError):
        destination(str(tmp_path))


def test_links_outside_sticky_directories_are_followed(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "dirlink").symlink_to(sub)
    assert destination(str(tmp_path / "link.json")).path == str(real)
    assert destination(str(tmp_path / "dirlink" / "x.json")).path == str(sub / "x.json")
    assert destination(str(sub / ".." / "real.json")).path == str(real)
    write_output(str(tmp_path / "link.json"), b"new")
    assert real.read_text() == "new" and (tmp_path / "link.json").is_symlink()


def test_link_loops_are_an_error(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="symbolic links"):
        destination(str(tmp_path / "a"))


def test_a_fifo_gets_the_bytes_in_place(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(str(fifo), b'{"ok": 1}')
    reader.join(timeout=10)
    assert got == [b'{"ok": 1}'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_append_keeps_what_a_regular_file_held(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("step 1\n")
    with output_file(str(summary), append=True) as f:
        f.write(b"step 2\n")
    assert summary.read_text() == "step 1\nstep 2\n"


def test_dash_keeps_the_shells_offset_and_text_order(tmp_path):
    """`> file` already holding text: what refcntd printed first stays first, and the
    file is neither reopened at offset 0 nor truncated."""
    out = tmp_path / "captured"
    code = ("import sys; from refcntd.inputs.outputfile import write_output;"
            "print('before'); write_output('/dev/stdout', b'bytes\\n'); print('after')")
    with out.open("w") as f:
        f.write("shell\n")
        f.flush()
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True)
    assert out.read_text() == "shell\nbefore\nbytes\nafter\n"
