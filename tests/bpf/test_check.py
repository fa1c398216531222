"""`refcntd check` and bad input: one clear line, the documented exit code."""

from __future__ import annotations

import os

from conftest import assert_one_line_error, refcntd


def test_no_kernel_headers_gets_one_line(bpf, build, tmp_path):
    env = dict(os.environ, BCC_KERNEL_SOURCE=str(tmp_path / "none"))
    result = refcntd(["run", "--", str(build.perflike("O2"))], env=env)
    assert_one_line_error(result, "BCC_KERNEL_SOURCE", "no include/ directory")
    assert result.returncode == 24
