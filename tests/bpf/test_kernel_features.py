"""The running kernel's features decide the program variant and how probes attach
(issue 40).  Each fallback Debian's 6.1 and 6.12 need runs here on the real kernel
too (REFCNTD_KERNEL_WITHOUT rules a feature out): the report must be the same as
with the feature, and a missing feature with no fallback is one line, exit 24, in
`check` as in `run`.  benchmarks/kernels.py runs the same on the old kernels.

Runs use --no-leak-kinds: the subject here is the kernel-feature fallbacks; leak kinds
split perflike's leaked maps into a definitely and an indirectly lost group where the
culprit test reads one.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from conftest import assert_one_line_error, functions, refcntd

RUN = ["run", "--no-leak-kinds"]  # the module docstring says why

FALLBACKS = "group_dead,uprobe_multi"


def without(features: str) -> dict[str, str]:
    return dict(os.environ, REFCNTD_KERNEL_WITHOUT=features)


def findings(report: dict) -> list[tuple[str, int, tuple[str, ...]]]:
    """(type, final count, allocation stack's functions) of every leaked object."""
    (process,) = report["processes"]
    return sorted((g["type"], i["count"], tuple(functions(g)))
                  for g in process["groups"] for i in g["instances"])


def test_probing_this_kernel_finds_every_feature(bpf):
    """6.18 has all of them: a probe that said otherwise would pick a fallback here.
    Soft-dirty pages (GET /leaks's pre-copy) as the kernel's own config says, where it
    shows it (this machine's 6.18 is built without CONFIG_MEM_SOFT_DIRTY)."""
    from refcntd.kernel import features
    found = features.probe()
    assert all(value is True for name, value in vars(found).items()
               if name not in ("release", "soft_dirty"))
    config = Path("/proc/config.gz")
    if config.exists():
        assert found.soft_dirty is ("CONFIG_MEM_SOFT_DIRTY=y" in
                                    gzip.decompress(config.read_bytes()).decode())
    assert found.soft_dirty is not None


def test_the_fallbacks_give_the_same_exact_report(bpf, build, tmp_path):
    exe = str(build.perflike("O2"))
    usual = refcntd([*RUN, "--", exe], tmp_path / "usual.json")
    fallback = refcntd([*RUN, "--", exe], tmp_path / "fallback.json", env=without(FALLBACKS))
    assert usual.returncode == fallback.returncode == 23, fallback.stderr
    assert findings(fallback.report) == findings(usual.report)
    assert fallback.report["leaked_objects"] == 8
    tracing = fallback.report["tracing"]
    assert tracing["complete"] and not tracing["lost"]
    assert all(p["installed"] for p in tracing["probes"])
    notes = " | ".join(tracing["notes"])
    assert "multi-uprobe links" in notes and "one perf event per probe" in notes
    assert "group_dead" in notes and "task->signal->live" in notes
    assert "multi-uprobe link(s)" not in notes  # nothing went through one


def test_the_fallbacks_name_the_same_culprit(bpf, build, tmp_path):
    exe = str(build.perflike("O2fp"))
    result = refcntd([*RUN, "--history", "map", "--", exe], tmp_path / "r.json",
                     env=without(FALLBACKS))
    assert result.returncode == 23, result.stderr
    (process,) = result.report["processes"]
    (kernel_maps,) = [g for g in process["groups"]
                      if "machine__create_kernel_maps" in functions(g)]
    first = kernel_maps["culprits"][0]
    assert (first["kind"], first["function"]) == ("missing put", "sample__resolve_kernel")


def test_a_missing_feature_without_fallback_is_one_line_in_run_and_check(bpf, build):
    exe = str(build.perflike("O2"))
    for args in ([*RUN, "--", exe], ["check", "--binary", exe]):
        result = refcntd(args, env=without("attach_cookie"))
        assert_one_line_error(result, "lacks the bpf_get_attach_cookie helper",
                              "Linux 5.15 has it")
        assert result.returncode == 24
    check = refcntd(["check", "--binary", exe], env=without("uprobe_multi"))
    assert check.returncode == 0, check.stderr
    assert "NO  multi-uprobe links" in check.stdout
    assert "attach: one perf event per probe site" in check.stdout
