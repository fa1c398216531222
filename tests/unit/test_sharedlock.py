"""The daemon's lock (service/sharedlock.py): readers share it, target changes exclude
them; ordering is checked with events, never with timings."""

from __future__ import annotations

import threading

from refcntd.service.sharedlock import SharedLock

WAIT_S = 10  # only a deadlock would reach it


def _hold_shared(lock: SharedLock, held: threading.Event, go: threading.Event) -> threading.Thread:
    def reader() -> None:
        with lock.shared:
            held.set()
            go.wait(WAIT_S)
    t = threading.Thread(target=reader)
    t.start()
    assert held.wait(WAIT_S)
    return t


def _reader(lock: SharedLock) -> tuple[threading.Thread, threading.Event]:
    """A reader started now; its event is set once it got in."""
    got_in = threading.Event()

    def reader() -> None:
        with lock.shared:
            got_in.set()
    t = threading.Thread(target=reader)
    t.start()
    return t, got_in


def test_readers_share_and_a_writer_waits_for_them():
    lock, held, go = SharedLock(), threading.Event(), threading.Event()
    slow = _hold_shared(lock, held, go)  # a pprof waiting on a report worker
    second, done = threading.Event(), threading.Event()
    done.set()
    _hold_shared(lock, second, done).join(WAIT_S)  # a scrape meanwhile, not waiting
    assert second.is_set()
    assert not lock.acquire(blocking=False)  # a target change waits for both
    go.set()
    slow.join(WAIT_S)
    assert lock.acquire(blocking=False)
    lock.release()


def test_the_writer_reenters_and_reads_through_its_own_hold():
    lock = SharedLock()
    with lock:
        with lock:  # management nests (a reload inside a round)
            with lock.shared:  # SIGUSR2's diff, written by the holder itself
                pass
        t, blocked = _reader(lock)
        t.join(0.2)
        assert not blocked.is_set()  # other threads wait for the writer
    t.join(WAIT_S)
    assert blocked.is_set()


def test_the_writer_lets_readers_in_while_it_attaches_then_holds_again():
    lock = SharedLock()
    with lock, lock:  # a reload inside a round: depth 2
        with lock.released():  # the slow attach
            second, done = threading.Event(), threading.Event()
            done.set()
            _hold_shared(lock, second, done).join(WAIT_S)  # a scrape does not wait
            assert second.is_set()
        t, blocked = _reader(lock)
        lock.release()  # still held once (depth restored): the reader waits
        t.join(0.2)
        assert not blocked.is_set()
        lock.acquire()
    t.join(WAIT_S)
    assert blocked.is_set()
    with lock.released():  # not the holder: nothing to let go
        assert lock.acquire(blocking=False)
        lock.release()
