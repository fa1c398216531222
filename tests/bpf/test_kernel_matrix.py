"""benchmarks/kernels.py's smoke set on this machine's kernel (issue 56): every case the
matrix boots Debian's 6.1 and 6.12 under QEMU for runs here too, against the same truth,
so a case that goes stale (a report that changed shape, as `history` once did when leak
kinds split its group) fails in the suite the day it does, not at the next matrix."""

from __future__ import annotations

import json
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import kernels  # noqa: E402
import kernels_guest  # noqa: E402


def test_every_matrix_case_passes_on_this_kernel(bpf, tmp_path, monkeypatch):
    monkeypatch.delenv("REFCNTD_CALIBRATION", raising=False)  # as shipped, as in a guest
    fixtures = kernels.fixtures(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert kernels_guest.main([str(out), str(fixtures)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert set(result["cases"]) == set(kernels_guest.CASES)
    failed = {name: case["detail"] for name, case in result["cases"].items() if not case["ok"]}
    assert not failed, failed
