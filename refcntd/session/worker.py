"""The report worker: everything after the drain runs here, never on the capture thread.

The capture thread reads the ring buffer and, at a process's exit, takes that
process's records out of the kernel maps; it hands the rest over as one job.
Symbolizing, attributing, rendering, writing files and freeing the kernel's
stack entries (after the report that read them is built) run on this thread,
in submission order, so a large report or a slow disk never keeps the ring
buffer from being read.  Other threads that need the symbolizer (a diff asked
for over HTTP) run their work here too, so one thread at a time uses it.
The workers of a process (serve's targets) share the modules their symbolizers
load: what uses them takes turns (symbolize/turn.py), a report only while it
symbolizes (lifecycle.py), work given by `call` throughout.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from refcntd.symbolize.turn import SYMBOLIZE

T = TypeVar("T")
Job = Callable[[], None]

# The capture thread's ring-buffer callbacks each take the GIL; while this
# worker computes, CPython hands it over only every switch interval (5 ms by
# default): at most ~200 events/s.  0.2 ms keeps capture far ahead of any
# program's anomaly or lifecycle rate at a few percent of the worker's time.
SWITCH_INTERVAL_S = 0.0002


class ReportWorker:
    """One thread running jobs in order; its first error is re-raised to the submitter."""

    def __init__(self, name: str = "refcntd-report") -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        if sys.getswitchinterval() > SWITCH_INTERVAL_S:
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self.raise_error()
        self._jobs.put(job)

    def call(self, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """Run `fn` on the worker (after the jobs before it) and wait for its result;
        `fn` uses the symbolizer, in turn with the process's other workers."""
        future: Future[T] = Future()

        def job() -> None:
            try:
                with SYMBOLIZE:
                    future.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)
        if not self._thread.is_alive():  # stopped (detached): run here, in turn
            with SYMBOLIZE:
                return fn()
        self._jobs.put(job)
        return future.result(timeout_s)

    def raise_error(self) -> None:
        """A bug in a report must not pass quietly: raise it on the capture thread."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        """Run every job submitted so far, stop, and raise the first error if any."""
        self.stop()
        self.raise_error()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()  # later reports still get built: they are other processes'
            except BaseException as err:  # noqa: BLE001 - re-raised on the capture thread
                self._error = self._error or err
