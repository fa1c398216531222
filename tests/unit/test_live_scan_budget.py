"""GET /leaks's budget (service/leakscan.py): the stop it expects for a process, from
its writable memory and its malloc blocks counted while it runs, and a process over
the budget never stopped.  On a real child process with a heap of known blocks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refcntd.reach import chunks
from refcntd.service import leakscan

HEAPFILL = Path(__file__).resolve().parents[2] / "benchmarks" / "heapfill.c"


@pytest.fixture(scope="module")
def heap(tmp_path_factory):
    """heapfill: 16 MiB in 64-byte blocks (about 210 k), asleep."""
    exe = tmp_path_factory.mktemp("heapfill") / "heapfill"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(HEAPFILL)], check=True)
    proc = subprocess.Popen([str(exe), "16", "64"], stdout=subprocess.PIPE, text=True)
    blocks = int(proc.stdout.readline().split()[1])
    yield proc.pid, blocks
    proc.kill()
    proc.wait()


def test_the_estimate_counts_the_blocks_and_prices_them(heap) -> None:
    pid, blocks = heap
    expected, size, counted = leakscan.estimate_s(pid)
    assert blocks <= counted <= blocks + 64  # heapfill's and libc's own few
    assert expected == pytest.approx(size / 2**30 * leakscan.SECONDS_PER_GIB
                                     + counted * leakscan.SECONDS_PER_BLOCK)


def test_without_the_compiled_walker_blocks_cost_more(monkeypatch) -> None:
    with_it = leakscan.expected_stop_s(1 << 30, 13_400_000)
    assert with_it == pytest.approx(1.0 + 0.67)  # 1 GiB of 64-byte blocks: about its stop
    monkeypatch.setattr(leakscan, "compiled", lambda: None)
    assert leakscan.expected_stop_s(1 << 30, 13_400_000) == pytest.approx(1.0 + 13.4)


def test_over_the_budget_the_process_is_not_stopped(heap) -> None:
    pid, _ = heap
    live = leakscan.scan_live(pid, budget_s=0.001)
    assert live.scan is None and live.stopped_s == 0
    assert live.skipped.startswith("scan not started:") and "over the budget of 0.001 s" \
        in live.skipped
    assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "SR"  # never stopped
    assert chunks.compiled() is not None  # the figures above are the compiled walker's
