"""One thread at a time uses what the process's symbolizers share.

serve's tracers (one per target and build) share the modules their symbolizers
load (symbolizer.py): libc's symbols and lines once, not once per target.
pyelftools' readers behind a module keep a position and caches, and are not
safe across threads, so what uses them takes turns: a report while it
symbolizes (session/lifecycle.py), a view handed to a worker (session/worker.py).
Reading the kernel's maps, a held process's memory and writing report files
are outside it.  A report waiting on the network (a debuginfod download, up to
its timeout) steps aside meanwhile: other targets' reports go on.
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
        """Let the others run while this thread waits.  Only where no shared module's
        reader is part-way through a read: the debug file search of a module that is
        not shared yet (debuginfod.py)."""
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


SYMBOLIZE = Turn()  # held while this process's shared modules are in use
