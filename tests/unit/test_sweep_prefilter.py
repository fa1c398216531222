"""The big-module sweep (byte prefilter, capstone's records read by numpy, forked
workers) finds exactly what one full sequential sweep reading every instruction
from Python finds, on Debian's libcrypto as installed (2.6 MB of -O2 code)."""

from __future__ import annotations

from pathlib import Path

from refcntd.binary import callsites, forked, prefilter
from refcntd.binary.elf import ElfImage

LIBCRYPTO = Path("/usr/lib/x86_64-linux-gnu/libcrypto.so.3")


def _outcome(scan: callsites.ModuleScan) -> dict[int, tuple[list[str], list[str]]]:
    return {t: (sorted(map(repr, r.sites)), sorted(r.blockers)) for t, r in scan.results.items()}


def test_prefiltered_parallel_sweep_equals_the_full_sweep(monkeypatch):
    image = ElfImage(LIBCRYPTO)
    assert prefilter.code_bytes(image) > prefilter.MIN_CODE_BYTES
    names = ["X509_up_ref", "EVP_PKEY_up_ref", "BIO_up_ref", "CRYPTO_free", "BIO_free",
             "OPENSSL_sk_push"]
    targets = {s.vaddr: n for n in names for s in image.symbols.get(n, [])}
    stubs = callsites.plt_stubs(image)
    for n in names:  # libcrypto calls its own exported functions through its PLT
        targets.update({stub: f"{n}@plt" for stub, _ in stubs.get(n, [])})
    monkeypatch.setattr(callsites, "_workers", lambda big: 2)
    fast = callsites.ModuleScan(image, targets)
    monkeypatch.setattr(callsites, "_workers", lambda big: 1)
    monkeypatch.setattr(prefilter, "MIN_CODE_BYTES", 1 << 40)
    full = callsites.ModuleScan(image, targets)
    assert sum(len(r.sites) for r in full.results.values()) > 100  # a real amount of work
    assert _outcome(fast) == _outcome(full)


def test_shares_are_consecutive_and_cover_every_cluster():
    clusters = [[callsites._Function(i * 100, 50 + (i % 7) * 10, f"f{i}")] for i in range(40)]
    shares = callsites._shares(clusters, 3)
    assert len(shares) == 3 and [c for s in shares for c in s] == clusters
    assert callsites._shares(clusters[:4], 3) == [clusters[:4]]  # too few to split


def test_a_failed_worker_share_is_swept_here(monkeypatch):
    """A worker that dies (here: it cannot pickle its findings) costs time, not sites."""
    image = ElfImage(LIBCRYPTO)
    targets = {s.vaddr: "CRYPTO_free" for s in image.symbols.get("CRYPTO_free", [])}
    targets.update({stub: "CRYPTO_free@plt"
                    for stub, _ in callsites.plt_stubs(image).get("CRYPTO_free", [])})
    monkeypatch.setattr(callsites, "_workers", lambda big: 1)
    alone = callsites.ModuleScan(image, targets)

    def broken(*_args: object, **_kw: object) -> bytes:
        raise RuntimeError("no")
    monkeypatch.setattr(forked.pickle, "dumps", broken)
    monkeypatch.setattr(callsites, "_workers", lambda big: 2)
    assert _outcome(callsites.ModuleScan(image, targets)) == _outcome(alone)
