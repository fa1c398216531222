"""`refcntd check` and bad input: one clear line, the documented exit code."""

from __future__ import annotations

import os

import pytest
from conftest import assert_one_line_error, refcntd


def test_no_kernel_headers_gets_one_line(bpf, build, tmp_path):
    env = dict(os.environ, BCC_KERNEL_SOURCE=str(tmp_path / "none"))
    result = refcntd(["run", "--", str(build.perflike("O2"))], env=env)
    assert_one_line_error(result, "BCC_KERNEL_SOURCE", "no include/ directory")
    assert result.returncode == 24


def test_half_of_debians_split_headers_gets_one_line(bpf, build, tmp_path):
    """/lib/modules/V/build on Debian is the -amd64 half only (issue 40: exit 139)."""
    (tmp_path / "half" / "include" / "generated").mkdir(parents=True)
    env = dict(os.environ, BCC_KERNEL_SOURCE=str(tmp_path / "half"))
    result = refcntd(["run", "--", str(build.perflike("O2"))], env=env)
    assert_one_line_error(result, "BCC_KERNEL_SOURCE", "kconfig.h", "unset BCC_KERNEL_SOURCE")
    assert result.returncode == 24


def test_a_failed_compile_is_one_line_and_the_process_lives(bpf, tmp_path, monkeypatch):
    """libbcc 0.26 can crash after a failed compile: it runs in a child, and whether
    the child crashed or failed, the caller gets clang's first error and survives."""
    from refcntd.errors import EnvironmentProblem
    from refcntd.kernel import bcccompile, program
    from refcntd.kernel.program import KernelOptions
    (tmp_path / "half" / "include" / "generated").mkdir(parents=True)
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(tmp_path / "half"))
    cflags = program.bpf_cflags(KernelOptions(filtered=True, has_delete=False), 16)
    with pytest.raises(EnvironmentProblem) as caught:
        bcccompile.compile_in_child(program.program_text(), cflags, True, tmp_path / "log")
    assert "failed to compile" in caught.value.message
    assert "kconfig.h" in caught.value.message
    assert "kconfig.h" in (tmp_path / "log" / "compile-error.txt").read_text()
    monkeypatch.delenv("BCC_KERNEL_SOURCE")
    from refcntd.kernel.kheaders import find_kernel_source
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(find_kernel_source()))
    with pytest.raises(EnvironmentProblem, match="undeclared_in_refcntd_test"):
        bcccompile.compile_in_child("int f(void *ctx) { return undeclared_in_refcntd_test; }",
                                    cflags, True, tmp_path / "log")
