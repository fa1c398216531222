"""A pre-fork pool (fork without exec): every worker's report exact and symbolized."""

from __future__ import annotations

from conftest import FIXTURES, functions, leak_summary, refcntd
from test_run import lib_spec

WORKERS = 20


def test_prefork_pool_every_child_report_exact(bpf, build, tmp_path):
    """Worker i leaks i+1 "job" objects made after the fork (stubs in a shared library,
    -O2 without frame pointers); even workers also get the inherited "pool" object
    (count 1 -> 2) and keep it; odd ones leave it alone.  A child's report holds what
    it created or changed; the untouched inherited object is the parent's only."""
    exe = build.program("prefork", [FIXTURES / "prefork.c"], "O2", shared_stubs=True)
    spec = lib_spec(tmp_path, build.stub_lib("O2"))
    # workers end with _exit(0), as prefork servers do: reported, not judged, unless
    # --judge-killed (LeakSanitizer would not check them at all)
    result = refcntd(["run", "--strict", "--judge-killed", "--spec", str(spec), "--", str(exe),
                      str(WORKERS)], tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    processes = result.report["processes"]
    (parent,) = [p for p in processes if "job" not in leak_summary(p)]
    workers = sorted((p for p in processes if p is not parent),
                     key=lambda p: len(leak_summary(p)["job"]))
    assert leak_summary(parent) == {"pool": [1]}
    # the workers' reports (first) did not free the stack they share with the parent
    assert functions(parent["groups"][0])[2:4] == ["main", "__libc_start_call_main"]
    assert len(workers) == WORKERS
    for i, p in enumerate(workers):
        expected = {"job": [1] * (i + 1)} | ({"pool": [2]} if i % 2 == 0 else {})
        assert leak_summary(p) == expected, (i, p)
        assert p["state"] == "exited" and not p["anomalies"], p
        assert p["direct_exit"] is True, p
        for group in p["groups"]:
            names = functions(group)
            assert names[0] == "__refcnt__init" and names[1].startswith("make"), names
            assert names[2:4] == (["worker", "main"] if group["type"] == "job" else
                                  ["main", "__libc_start_call_main"]), names
            assert all(f.get("function") for f in group["stack"]), group["stack"]
    assert "unknown" not in str(result.report["tracing"]), result.report["tracing"]
