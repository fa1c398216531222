"""USDT without tracing: the fixture's semaphore-gated code does not run untraced, and a
spec naming a USDT probe the binary lacks is one line (no BPF; probes gated by
semaphores the kernel owns are tested in tests/bpf/test_usdt.py)."""

from __future__ import annotations

import subprocess

from conftest import ROOT, assert_one_line_error, refcntd


def test_guarded_code_does_not_run_untraced(build):
    exe, _ = build.usdt_program("-O2")
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "guarded 0"


def test_missing_usdt_probe_is_one_line(build, tmp_path):
    exe, _ = build.usdt_program("-O2")
    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "configs/specs/example-usdt.yaml").read_text()
                    .replace("widget:ref", "widget:nope"))
    result = refcntd(["run", "--spec", str(spec), "--", str(exe)])
    assert_one_line_error(result, "no USDT probe widget:nope", str(exe))
    assert result.returncode == 24
