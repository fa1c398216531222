"""The daemon's lock: readers (scrapes, /status, diffs, pprof) share it, target
changes (attach, detach, reload) hold it alone.

One plain lock made every reader wait for every other: a `/debug/pprof/refcount`
waits on each tracer's report worker (behind its queued reports) and held the
lock meanwhile, so under the soak's churn (issue 43) a scrape waited 4.3 s for
a 43 s profile.  Readers only need the tracers to stay attached while they read
their maps; they do not need to exclude one another.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class SharedLock:
    """Exclusive side: `with lock`, `acquire(blocking)`/`release()`, reentrant for its
    holder (the daemon's management nests).  Shared side: `with lock.shared`; the
    exclusive holder passes straight through it (a signal handler on its thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._owner: int | None = None  # the exclusive holder's thread
        self._depth = 0
        self.shared = _Shared(self)

    def acquire(self, blocking: bool = True) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            while self._owner is not None or self._readers:
                if not blocking:
                    return False
                self._cond.wait()
            self._owner, self._depth = me, 1
            return True

    def release(self) -> None:
        with self._cond:
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()

    @contextmanager
    def released(self) -> Iterator[None]:
        """The exclusive holder lets readers in meanwhile (an attach of 4.5-52 s under
        the soak's load made every scrape wait for it), then holds the lock again at
        the same depth.  Only the holder changes the targets, so readers see them
        before or after a change, never half-made.  Not the holder: nothing to let go."""
        me = threading.get_ident()
        with self._cond:
            depth = self._depth if self._owner == me else 0
            if depth:
                self._owner, self._depth = None, 0
                self._cond.notify_all()
        try:
            yield
        finally:
            if depth:
                self.acquire()
                self._depth = depth

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _enter_shared(self) -> bool:
        """True if a reader was counted (False: the exclusive holder reading)."""
        with self._cond:
            if self._owner == threading.get_ident():
                return False
            while self._owner is not None:
                self._cond.wait()
            self._readers += 1
            return True

    def _exit_shared(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()


class _Shared:
    def __init__(self, lock: SharedLock) -> None:
        self._lock = lock
        self._counted = threading.local()  # per thread: a stack of _enter_shared()'s answers

    def __enter__(self) -> None:
        stack = self._counted.__dict__.setdefault("stack", [])
        stack.append(self._lock._enter_shared())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._counted.stack.pop():
            self._lock._exit_shared()
