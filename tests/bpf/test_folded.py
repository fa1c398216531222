"""Leaks as folded stacks (flame graphs), from a real traced run's saved report."""

from __future__ import annotations

from conftest import refcntd
from test_run import PERFLIKE_LEAKS


def test_folded_stacks_of_a_real_run(bpf, build, tmp_path):
    exe = build.perflike("O2fp")
    saved = tmp_path / "run.json"
    assert refcntd(["run", "--", str(exe)], json_path=saved).returncode == 23
    out = refcntd(["report", "--format", "folded", str(saved)])
    assert out.returncode == 23 and "Traceback" not in out.stderr
    lines = out.stdout.splitlines()
    by_type: dict[str, int] = {}
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        assert frames[0] == "perflike" and "main" in frames  # outermost first
        assert frames[-2] == "__refcnt__init" and frames[-1].startswith("[")
        by_type[frames[-1][1:-1]] = by_type.get(frames[-1][1:-1], 0) + int(count)
    assert by_type == {t: len(c) for t, c in PERFLIKE_LEAKS.items()}
    assert any(line.startswith("perflike;") and ";machine__create_kernel_maps;map__new;"
               in line for line in lines)
