"""Bundled spec openssl on Debian's OpenSSL 3 (libcrypto.so.3, libssl.so.3): 3.0 on
Debian 12, 3.5 on Debian 13."""

from __future__ import annotations

import pytest
from catalog import (
    assert_balanced,
    assert_counts_whole,
    assert_double_caught,
    assert_exact_leaks,
    build,
    trace,
)


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return build(tmp_path_factory.mktemp("ssl"), "sslobjs.c", ["libssl", "libcrypto"])


def test_balanced_program_reports_nothing(bpf, exe, tmp_path):
    assert_balanced(trace(tmp_path, "openssl", [str(exe), "balanced"]))


def test_leaks_are_exact(bpf, exe, tmp_path):
    out = trace(tmp_path, "openssl", [str(exe), "leak"])
    assert_exact_leaks(out)
    assert {t for t, _ in out.leaks} == {"X509", "EVP_PKEY", "BIO", "SSL_CTX", "SSL"}


def test_real_double_free_is_caught(bpf, exe, tmp_path):
    assert_double_caught(trace(tmp_path, "openssl", [str(exe), "double"]))


def test_program_a_shell_starts_is_balanced(bpf, exe, tmp_path):
    """libssl calls libcrypto's X509_up_ref (probed at its call sites) through its PLT.
    Run by `sh -c`, the program and libssl are mapped after start; libssl, which defines
    SSL_CTX_up_ref, was taken as scanned, its calls went unprobed and every X509 the
    SSL_CTX held ended in put-after-delete (OpenSSL's s_server/s_client in the corpus)."""
    out = trace(tmp_path, "openssl", ["sh", "-c", f"{exe} balanced"])
    (prog,) = [p for p in out.report["processes"] if p["comm"] == exe.name]
    assert prog["groups"] == [] and prog["anomalies"] == [], out.stderr
    assert_counts_whole(out)
