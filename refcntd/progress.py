"""Where refcntd's time goes, and progress for steps a user would otherwise think hung.

Every stage of check/attach/run runs inside `stage(name)`.  A stage that
lasts longer than SHOW_AFTER_S shows itself on stderr: a progress bar that
redraws in place on a terminal, one line per stage otherwise.  `--verbose`
prints each stage's duration when it ends; `--quiet` prints nothing.  Stages
report their progress with `advance(done, total)`.

One reporter per process (the CLI configures it): the stages are spread over
the pipeline, and threading a reporter through every call would touch every
signature for a side channel.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO

SHOW_AFTER_S = 1.0
BAR_WIDTH = 30


@dataclass
class Reporter:
    verbose: bool = False
    quiet: bool = True  # silent until the CLI says otherwise (library use, tests)
    stream: TextIO = sys.stderr
    timings: list[tuple[str, float]] = field(default_factory=list)
    _current: str | None = None
    _started: float = 0.0
    _done: int = 0
    _total: int = 0
    _shown: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _timer: threading.Timer | None = None

    @property
    def tty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def begin(self, name: str) -> None:
        with self._lock:
            self._current, self._started = name, time.monotonic()
            self._done = self._total = 0
            self._shown = False
        if not self.quiet:
            self._timer = threading.Timer(SHOW_AFTER_S, self._show)
            self._timer.daemon = True
            self._timer.start()

    def advance(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total
            if self._shown and self.tty:
                self._draw()

    def end(self) -> float:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            elapsed = time.monotonic() - self._started
            name, self._current = self._current or "", None
            if self._shown and self.tty:
                self.stream.write("\r\033[K")
            self.timings.append((name, elapsed))
        if self.verbose and not self.quiet:
            self.note(f"{name}: {elapsed:.2f} s")
        return elapsed

    def note(self, text: str) -> None:
        """A --verbose line (timings, what was cached or overlapped)."""
        if self.verbose and not self.quiet:
            print(f"refcntd: {text}", file=self.stream, flush=True)

    def _show(self) -> None:
        with self._lock:
            if self._current is None:
                return
            self._shown = True
            if self.tty:
                self._draw()
            else:
                print(f"refcntd: {self._current}...", file=self.stream, flush=True)

    def _draw(self) -> None:
        elapsed = time.monotonic() - self._started
        if self._total:
            filled = BAR_WIDTH * self._done // self._total
            bar = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self._done}/{self._total}"
        else:
            bar = "..."
        self.stream.write(f"\r\033[Krefcntd: {self._current} {bar} {elapsed:.0f} s")
        self.stream.flush()


REPORTER = Reporter()


def _in_forked_child() -> None:
    """A forked analysis worker (binary/forked.py) shows nothing: its parent shows the
    progress.  Nor may it wait on the lock: another thread of the parent (the timer
    drawing the bar) may have held it at the fork, and no thread would release it."""
    REPORTER._lock = threading.Lock()
    REPORTER._timer = None
    REPORTER.quiet = True


os.register_at_fork(after_in_child=_in_forked_child)


def configure(verbose: bool, quiet: bool, stream: TextIO | None = None) -> Reporter:
    REPORTER.verbose, REPORTER.quiet = verbose, quiet
    if stream is not None:
        REPORTER.stream = stream
    return REPORTER


@contextmanager
def stage(name: str) -> Iterator[Reporter]:
    REPORTER.begin(name)
    try:
        yield REPORTER
    finally:
        REPORTER.end()


def advance(done: int, total: int) -> None:
    REPORTER.advance(done, total)


def note(text: str) -> None:
    REPORTER.note(text)
