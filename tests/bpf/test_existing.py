"""Constructors that may return an object that exists already (spec
`may_return_existing`): a singleton accessor, a GObject-style constructor
override, d2i_X509(&x, ...) decoding into x.  On tests/fixtures/existing.c
(-O2, no frame pointers), whose own books are the truth, and on the real
programs that ended INCOMPLETE with "objects re-initialised at a live address"
before: `openssl x509`, `openssl verify`, GLib's installed tests `singleton` and
`object`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from catalog import Outcome, assert_balanced, assert_exact_leaks, trace
from conftest import FIXTURES, assert_probe_mode, cc, refcntd

SPEC = FIXTURES / "existing.yaml"
ROUNDS = 20  # balanced_round() calls in existing.c
# Per round: registry_get x2 and service_new x2 return the live singleton,
# cert_decode(&c) x2 hands c back; cert_decode(&d, "bad") drops d.
EXISTING_PER_ROUND, DROPPED_PER_ROUND = 6, 1
GLIB_TESTS = Path("/usr/libexec/installed-tests/glib")


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return cc(tmp_path_factory.mktemp("existing") / "existing", [FIXTURES / "existing.c"],
              ["-O2", "-fomit-frame-pointer"])


def note_count(out: Outcome, text: str) -> int:
    """The number in front of the tracing note containing `text` (0: no such note)."""
    found = [int(n.split()[0]) for n in out.report["tracing"]["notes"] if text in n]
    assert len(found) <= 1, out.report["tracing"]["notes"]
    return found[0] if found else 0


EXISTING_NOTE = "constructors that returned an object already live"
DROPPED_NOTE = "objects a constructor was given to reuse and dropped"


def test_balanced_program_no_reinit_no_anomaly(bpf, exe, tmp_path, probe_mode):
    out = trace(tmp_path, str(SPEC), [str(exe), "balanced"])
    assert_balanced(out)
    assert_probe_mode(out.report, probe_mode)
    assert out.returncode == 0, out.stderr
    assert note_count(out, EXISTING_NOTE) == ROUNDS * EXISTING_PER_ROUND
    assert note_count(out, DROPPED_NOTE) == ROUNDS * DROPPED_PER_ROUND
    assert all(p["hits"] > 0 for p in out.report["tracing"]["probes"]), out.stderr


def test_leaks_are_exact_and_each_singleton_return_counts(bpf, exe, tmp_path):
    out = trace(tmp_path, str(SPEC), [str(exe), "leak"])
    assert_exact_leaks(out)
    assert {t for t, _ in out.leaks} == {"Registry", "Service", "Cert"}
    ops = {g["type"]: (i["count"], i["gets"], i["puts"])
           for g in out.process["groups"] for i in g["instances"]}
    # registry_get x3: one new object, two returns counted as gets; two obj_unref.
    # service_new x2: the second's obj_ref is the get; one obj_unref.
    assert ops == {"Registry": (1, 2, 2), "Service": (1, 1, 1), "Cert": (1, 0, 0)}
    assert note_count(out, EXISTING_NOTE) == ROUNDS * EXISTING_PER_ROUND + 4


def test_history_records_the_singleton_return_as_a_get(bpf, exe, tmp_path):
    result = refcntd(["run", "--spec", str(SPEC), "--history", "Registry", "--",
                      str(exe), "leak"], tmp_path / "h.json")
    (instance,) = [i for p in result.report["processes"] for g in p["groups"]
                   if g["type"] == "Registry" for i in g["instances"]]
    ops = [(h["op"], h["count_after"]) for h in instance["history"]]
    assert ops == [("init", 1), ("get", 2), ("get", 3), ("put", 2), ("put", 1)], ops
    # the two gets are registry_get's returns in main (the constructor's caller)
    assert all(h["stack"][0]["function"] == "main" for h in instance["history"])


def test_without_the_option_the_same_program_is_misread(bpf, exe, tmp_path):
    """The control: the spec without may_return_existing re-initialises live objects."""
    plain = tmp_path / "plain.yaml"
    plain.write_text(re.sub(r"\n\s*may_return_existing: .*", "", SPEC.read_text()))
    out = trace(tmp_path, str(plain), [str(exe), "balanced"])
    lost = out.report["tracing"]["lost"]
    assert any("re-initialised at a live address" in k for k in lost), lost
    assert out.returncode in (23, 24) and out.anomalies, out.stderr  # and false findings


def test_check_says_which_constructors_may_return_an_existing_object(bpf, exe):
    result = refcntd(["check", "--binary", str(exe), "--spec", str(SPEC)])
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("may return an existing")]
    assert [ln.split(":")[1].strip() for ln in lines] == \
        ["registry_get", "service_new", "cert_decode"], result.stdout
    assert "a get on it" in lines[0] and "*argument 1 held at entry" in lines[2]


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


def _certificate(tmp_path: Path) -> Path:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=t",
                    "-keyout", str(tmp_path / "k"), "-out", str(tmp_path / "c.pem")],
                   check=True, capture_output=True)
    return tmp_path / "c.pem"


def _default_bundle_certificates() -> int:
    """Certificates in OpenSSL's default CA file, which `openssl x509` loads."""
    text = subprocess.run(["openssl", "version", "-d"], capture_output=True, text=True).stdout
    bundle = Path(text.split('"')[1]) / "cert.pem"
    return bundle.read_text().count("BEGIN CERTIFICATE") if bundle.exists() else 0


def assert_clean_real_run(out: Outcome) -> None:
    assert out.returncode == 0, out.stderr
    assert out.report["tracing"]["complete"], out.stderr
    assert "re-initialised" not in out.stderr and out.report["tracing"]["lost"] == {}
    assert_balanced(out)


@needs_openssl
def test_openssl_x509_is_clean(bpf, tmp_path):
    pem = _certificate(tmp_path)
    out = trace(tmp_path, "openssl", ["openssl", "x509", "-in", str(pem), "-noout", "-subject"])
    assert_clean_real_run(out)
    # Each certificate of the default bundle, and c.pem, is X509_new_ex'd and then
    # decoded into by d2i_X509(&x, ...).
    assert note_count(out, EXISTING_NOTE) == _default_bundle_certificates() + 1


@needs_openssl
def test_openssl_verify_is_clean(bpf, tmp_path):
    pem = _certificate(tmp_path)
    out = trace(tmp_path, "openssl", ["openssl", "verify", "-CAfile", str(pem), str(pem)])
    assert_clean_real_run(out)
    assert note_count(out, EXISTING_NOTE) == 2  # the CA file's certificate, the one verified


@pytest.mark.parametrize("test,returns", [
    ("singleton", 1),  # gobject/tests/singleton.c: the second g_object_new
    ("object", 2),     # test_object_constructor_singleton: two, three
])
def test_glib_singleton_tests_are_clean(bpf, tmp_path, test, returns):
    program = GLIB_TESTS / test
    if not program.exists():
        pytest.skip("Debian's libglib2.0-tests is not installed")
    out = trace(tmp_path, "gobject", [str(program)])
    assert_clean_real_run(out)
    assert note_count(out, EXISTING_NOTE) == returns
