"""The systemd unit shipped for `refcntd serve` passes `systemd-analyze verify` (no BPF;
serve itself is tested in tests/bpf/test_serve.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import ROOT


def test_unit_file_passes_systemd_analyze_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (scripts/setup.sh installs systemd)")
    unit = tmp_path / "refcntd.service"
    text = (ROOT / "systemd/refcntd.service").read_text()
    # ExecStart must exist for verify: point it at this checkout's venv
    unit.write_text(text.replace("/opt/refcntd/.venv/bin/refcntd",
                                 str(ROOT / ".venv/bin/refcntd")))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
