"""A pre-fork pool (fork without exec): every worker's report exact and symbolized."""

from __future__ import annotations

from conftest import FIXTURES, functions, leak_summary, refcntd
from test_run import lib_spec

WORKERS = 20


def test_prefork_pool_every_child_report_exact(bpf, build, tmp_path):
    """Worker i leaks i+1 "job" objects made after the fork (stubs in a shared library,
    -O2 without frame pointers); the parent leaks its one "pool" object, which the
    workers inherit but never touch, so it is in the parent's report only."""
    exe = build.program("prefork", [FIXTURES / "prefork.c"], "O2", shared_stubs=True)
    spec = lib_spec(tmp_path, build.stub_lib("O2"))
    result = refcntd(["run", "--strict", "--spec", str(spec), "--", str(exe), str(WORKERS)],
                     tmp_path / "r.json")
    assert result.returncode == 23, result.stderr
    processes = result.report["processes"]
    parent = [p for p in processes if leak_summary(p).get("pool")]
    workers = [p for p in processes if p not in parent]
    assert len(parent) == 1 and leak_summary(parent[0]) == {"pool": [1]}
    assert sorted(len(leak_summary(p)["job"]) for p in workers) == list(range(1, WORKERS + 1))
    for p in workers:
        assert p["state"] == "exited" and not p["anomalies"], p
        (group,) = p["groups"]
        assert group["type"] == "job"
        names = functions(group)
        assert names[0] == "__refcnt__init" and names[1].startswith("make"), names
        assert names[2:4] == ["worker", "main"], names
        assert all(f.get("function") for f in group["stack"]), group["stack"]
