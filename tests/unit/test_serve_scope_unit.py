"""issue 58's pieces that need no kernel: process starts and warm-up (metrics), which
sessions are processes and what they are called (lifecycle), JIT files (unwind), the
config's warm_up."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from refcntd.errors import ConfigError
from refcntd.inputs.config import load_config
from refcntd.service.metrics import ProcessStarts
from refcntd.session.lifecycle import _tgid_of, read_comm
from refcntd.session.unwind import _is_elf


def fake_proc(root: Path, pid: int, tgid: int, comm: str, start_ticks: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    # comm with a space and a parenthesis: fields are counted after the last ")"
    fields = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) x) {' '.join(fields)}\n")
    (d / "status").write_text(f"Name:\t{comm}\nTgid:\t{tgid}\nPid:\t{pid}\n")
    (d / "comm").write_text(comm + "\n")


def test_objects_of_a_process_s_first_seconds_are_warm_up(tmp_path):
    tick = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    fake_proc(tmp_path, 10, 10, "gst-launch-1.0", 500)
    starts = ProcessStarts(tmp_path)
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    started = 500 * tick - boot
    assert starts.warming(10, started + 9_000_000_000, 10.0)
    assert not starts.warming(10, started + 11_000_000_000, 10.0)
    assert not starts.warming(10, started, 0.0)  # warm_up: 0s: nothing set apart
    assert not starts.warming(11, started, 10.0)  # gone: counted (its report will come)


def test_threads_are_not_processes_and_processes_keep_their_name(tmp_path):
    fake_proc(tmp_path, 20, 20, "gst-launch-1.0", 1)
    fake_proc(tmp_path, 21, 20, "audiotestsrc0:s", 1)
    assert _tgid_of(20, tmp_path) == 20 and _tgid_of(21, tmp_path) == 20
    assert _tgid_of(22, tmp_path) is None
    assert read_comm(20, tmp_path) == "gst-launch-1.0" and read_comm(22, tmp_path) == ""


def test_jit_code_in_a_file_is_no_elf_file(tmp_path):
    orc = tmp_path / "orcexec.abc"
    orc.write_bytes(b"\xc3" * 64)
    elf = tmp_path / "lib.so"
    elf.write_bytes(b"\x7fELF" + b"\0" * 60)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not _is_elf(str(orc)) and _is_elf(str(elf))
    assert _is_elf(str(fifo))  # never opened for a read that waits: the load says why
    assert _is_elf(str(tmp_path / "gone (deleted)"))


def test_warm_up_is_a_duration(tmp_path):
    config = tmp_path / "refcntd.yaml"
    target = "targets:\n  - {name: t, path: /usr/bin/true, warm_up: %s}\n"
    config.write_text("version: 1\n" + target % "30s")
    assert load_config(str(config)).targets[0].warm_up_s == 30
    config.write_text("version: 1\n" + target % "soon")
    with pytest.raises(ConfigError, match="warm_up"):
        load_config(str(config))
