"""One thread at a time uses what the process's symbolizers share.

serve's tracers (one per target and build) share the modules their symbolizers
load (symbolizer.py): libc's symbols and lines once, not once per target.
pyelftools' readers behind a module keep a position and caches, and are not
safe across threads, so the report workers take turns (session/worker.py).
A job waiting on the network (a debuginfod download, up to its timeout) steps
aside meanwhile: another target's reports are not held up by it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class Turn:
    """A re-entrant lock whose holder can step aside while it waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> None:
        me = threading.get_ident()
        if self._owner != me:
            self._lock.acquire()
            self._owner = me
        self._depth += 1

    def __exit__(self, _t: type[BaseException] | None, _e: BaseException | None,
                 _tb: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Let the others run while this thread waits (no shared module in hand)."""
        me = threading.get_ident()
        if self._owner != me:
            yield
            return
        depth, self._depth, self._owner = self._depth, 0, None
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._owner, self._depth = me, depth


SYMBOLIZE = Turn()  # held while a report worker of the process runs a job
