"""Culprits the holders decide (analysis/holderevidence.py), on a real -O2 program traced
with --history and scanned at exit: perf 6.1's kernel-dso leak in small
(tests/fixtures/heldby.c), truth by construction.  History alone gives each kernel dso
to another leaked dso (ownership.py's guess from paths and times); the scan sees no
pointer from there and one reference held by nothing: the function that kept it is
named, or, while calibration does not trust the rule, is the one candidate."""

from __future__ import annotations

import re

import pytest
from conftest import EXAMPLES, FIXTURES, cc, refcntd, shipped_table_env

from refcntd.analysis import calibration

TRUTH = "machine__process_kernel_mmap"


@pytest.fixture(scope="module")
def result(bpf, tmp_path_factory):
    out = tmp_path_factory.mktemp("heldby")
    program = cc(out / "heldby", [FIXTURES / "heldby.c", EXAMPLES / "refcnt.c"],
                 ["-O2", "-fomit-frame-pointer"])
    return refcntd(["run", "--history", "all", "--", str(program)], out / "r.json",
                   env=shipped_table_env())


def test_each_kernel_dso_is_a_direct_leak_of_the_function_that_kept_it(result):
    kernel = {int(a, 16) for a in re.findall(r"^DSO kernel (0x[0-9a-f]+)$", result.stdout,
                                             re.M)}
    assert len(kernel) == 2, result.stdout
    (process,) = result.report["processes"]
    dsos = [(g, i) for g in process["groups"] if g["type"] == "dso" for i in g["instances"]]
    # the user dsos were released: only the kernel ones are left
    assert {int(i["address"], 16) for _, i in dsos} == kernel, result.stderr
    trusted = calibration.shipped().trusts("holders-refute")
    for group, obj in dsos:
        assert obj["count"] == 2 and obj["holders"] == 1 and obj["unheld"] == 1
        assert obj.get("leak", "direct") == "direct" and not obj.get("held_by")
        verdict = group["verdict"]
        if trusted:
            (top, *_) = group["culprits"]
            assert verdict["status"] == "culprit" and top["function"] == TRUTH
            assert (top["rule"], top["evidence"]) == ("holders-refute", "holders")
        else:
            assert verdict["status"] == "unknown" and not group.get("culprits")
            assert verdict["candidates"] == [TRUTH]
            assert "rule 'holders-refute' (holders)" in verdict["reason"]
    said = "named by: holders (rule holders-refute)" if trusted else \
        f"candidate: missing put in {TRUTH}"
    assert result.stderr.count(said) == 2, result.stderr
