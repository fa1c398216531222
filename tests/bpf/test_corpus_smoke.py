"""The corpus of real programs (benchmarks/corpus.py --smoke): each program's
classification is the one measured and committed in benchmarks/results/corpus.md,
false findings included, so that a change in either direction is seen."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

# (family, program) -> classification, as in benchmarks/results/corpus.md
EXPECTED = {
    ("glib-tests", "hash"): "clean",
    ("glib-tests", "singleton"): "clean",  # its constructor's live singleton: may_return_existing
    ("gio-tools", "gio info /etc/passwd"): "clean",  # GIO's GVfs and modules: kept (gobject spec)
    ("gstreamer", "fakesrc num-buffers=200 ! fakesink"): "clean",
    ("virsh", "virsh list --all"): "clean",
    ("openssl", "x509 -text"): "clean",  # d2i_X509(&x) into a live X509: may_return_existing
}
pytestmark = pytest.mark.skipif(shutil.which("gst-launch-1.0") is None,
                                reason="the corpus's programs: scripts/setup.sh")


def test_corpus_smoke_classifications(bpf, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/corpus.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((tmp_path / "corpus.json").read_text())["runs"]
    got = {(r["family"], r["name"]): r["cls"] for r in runs}
    assert got == EXPECTED, proc.stderr[-3000:]
    hash_run = next(r for r in runs if r["name"] == "hash")
    assert sum(hash_run["kept"].values()) >= 1  # GLib's own tables: kept and counted
    assert (tmp_path / "corpus.md").read_text().startswith("# Corpus of real programs")
