"""Run one piece of the analysis in a forked child and take its answer back.

Why: the analysis is CPU-bound Python, and its big pieces are independent
(shares of a big module's call-site sweep, the DWARF scan for inlined
copies): a fork puts each on a CPU of its own.  The answer comes back
pickled through a pipe.  A child that fails costs time, never answers:
`result()` is then None and the caller computes the piece itself.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Forked(Generic[T]):
    """`work()` running in a child from construction on; `result()` waits for it once."""

    def __init__(self, work: Callable[[], T]) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(read)
                data = pickle.dumps(work())
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._pipe = pid, read

    def result(self) -> T | None:
        """The child's answer; None when it failed (an exception, a signal, no answer)."""
        with os.fdopen(self._pipe, "rb") as source:
            data = source.read()
        _, status = os.waitpid(self._pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        answer: T = pickle.loads(data)
        return answer
