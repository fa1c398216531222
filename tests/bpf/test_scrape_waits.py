"""A scrape waits for nothing that is not its own (issue 43): not a detach, not the
pruning of reports, not a turn at the GIL per map entry.  Ordering by events and
counted syscalls, never wall time."""

from __future__ import annotations

import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_soak import _daemon, _soakgen


@pytest.mark.parametrize("how", ["binary removed", "target removed"])
def test_a_scrape_does_not_wait_for_a_detach(bpf, tmp_path, how):
    """A detach (the old build at an upgrade, a target gone at a reload) builds the
    tracer's last reports and closes its maps: 0.44-0.51 s of the daemon's lock in the
    short soak, every scrape waiting. The tracer leaves the readers' view under the
    lock and is detached outside it: with its last reports held open, a scrape and
    /status answer and no longer show it (ordering by events)."""
    exe = _soakgen(tmp_path)
    daemon = _daemon(tmp_path, exe)
    (old,) = daemon.targets.runtimes["gen"].tracers.values()
    started, gate = threading.Event(), threading.Event()
    finish = old.finish

    def held_finish(result):  # noqa: ANN001, ANN202 - the real last reports, held open
        started.set()
        gate.wait(120)  # longer than the scrape is given: a wait shows as a failure
        return finish(result)
    old.finish = held_finish
    if how == "binary removed":
        exe.unlink()
        daemon._next_watch = 0.0
        manage = threading.Thread(target=daemon._round)
    else:  # what a reload does with a target no longer configured
        def remove() -> None:
            with daemon.lock:
                daemon.targets.remove("gen")
        manage = threading.Thread(target=remove)
    scraped: list[tuple[str, dict]] = []
    try:
        manage.start()
        assert started.wait(60)
        scrape = threading.Thread(target=lambda: scraped.append(
            (generate_latest(_registry(daemon)).decode(), daemon.status())))
        scrape.start()
        scrape.join(60)
        assert not scrape.is_alive() and not gate.is_set()
        text, status = scraped[0]
        assert 'refcntd_binary_attached_since_seconds{target="gen"' not in text
        assert not status["targets"].get("gen", {}).get("attached")
    finally:
        gate.set()
        manage.join(60)
        daemon.shutdown()
    assert not manage.is_alive() and old.worker._thread.is_alive() is False


def _registry(daemon):  # noqa: ANN001, ANN202 - prometheus_client's registry
    registry = CollectorRegistry()
    registry.register(daemon.collector())
    return registry


def test_a_scrape_makes_no_syscall_per_map_entry(bpf, tmp_path, monkeypatch):
    """Each bpf() syscall lets the GIL go, and under the soak's churn a scrape then
    waited its turn behind the report workers to take it back: a lookup per counter
    and a syscall per key of the maps it counts made 45 syscalls per tracer idle and
    hundreds under churn (scrapes of 100-500 ms). Batch reads make them a handful per
    map, however many processes, sites and bins are live."""
    from refcntd.kernel import bpfsys
    exe = _soakgen(tmp_path)
    daemon = _daemon(tmp_path, exe)
    registry, calls, real = _registry(daemon), [], bpfsys.call
    monkeypatch.setattr(bpfsys, "call", lambda cmd, attr: (calls.append(cmd), real(cmd, attr))[1])

    def scrape() -> int:
        calls.clear()
        generate_latest(registry)
        return len(calls)
    idle, live = scrape(), []
    try:
        for seed in range(12):  # each holds its leaks alive until killed
            live.append(subprocess.Popen([str(exe), "kill", str(seed)], stdout=subprocess.PIPE,
                                         text=True))
        for proc in live:
            assert proc.stdout is not None and proc.stdout.readline().startswith("TRUTH")
        busy = scrape()
        (tracer,) = daemon.targets.runtimes["gen"].tracers.values()
        fill = tracer.kernel.map_fill()
    finally:
        for proc in live:
            proc.kill()
            proc.wait()
        daemon.shutdown()
    assert fill["processes"][0] >= 12 and fill["age_bins"][0] >= 12, fill
    assert busy <= idle + 2, (idle, busy)  # + a delete of old age bins, at most


def test_a_scrape_does_not_wait_for_the_reports_pruning(bpf, tmp_path):
    """Every minute the daemon lists its report directory (up to max_reports files),
    prunes it and trims malloc's free pages: under the daemon's lock, a scrape waited
    for it (41 ms in the short soak). None of it touches the targets: it runs before
    the lock is taken, and a scrape answers while it is held open."""
    daemon = _daemon(tmp_path, _soakgen(tmp_path))
    started, gate = threading.Event(), threading.Event()
    prune = daemon.store.prune

    def held_prune() -> None:
        started.set()
        gate.wait(120)  # longer than the scrape is given: a wait shows as a failure
        prune()
    daemon.store.prune = held_prune  # type: ignore[method-assign]
    daemon._next_prune = 0.0
    manage = threading.Thread(target=daemon._round)
    try:
        manage.start()
        assert started.wait(60)
        scrape = threading.Thread(target=lambda: generate_latest(_registry(daemon)))
        scrape.start()
        scrape.join(60)
        assert not scrape.is_alive() and not gate.is_set()
    finally:
        gate.set()
        manage.join(60)
        daemon.shutdown()
