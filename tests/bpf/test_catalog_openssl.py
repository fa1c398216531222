"""Bundled spec openssl on Debian's OpenSSL 3.0 (libcrypto.so.3, libssl.so.3)."""

from __future__ import annotations

import pytest
from catalog import assert_balanced, assert_double_caught, assert_exact_leaks, build, trace


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
