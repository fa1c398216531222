"""One error hierarchy; each error knows the exit status it maps to.

`cli.main` is the single place that turns these into one line on stderr and
an exit code.  Anything that is not a RefcntdError is a bug in refcntd and
keeps its traceback.
"""

from __future__ import annotations

from refcntd.text import visible

EXIT_USAGE = 2
EXIT_FINDINGS = 23
EXIT_INCOMPLETE = 24


class RefcntdError(Exception):
    """An expected failure: bad input or an environment we cannot trace in."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def line(self) -> str:
        """The single line shown to the user (control characters escaped: a path or name
        holding a newline must not make it two)."""
        if self.remedy:
            return visible(f"refcntd: {self.message} ({self.remedy})")
        return visible(f"refcntd: {self.message}")


class UsageError(RefcntdError):
    """Bad command line."""


class ConfigError(RefcntdError):
    """A spec or config file is malformed; the message names file, line and key."""

    def __init__(self, path: str, line: int, key: str, problem: str) -> None:
        problem = " ".join(problem.split())  # parser messages can span lines: keep one
        super().__init__(f"{path}:{line}: {key}: {problem}")
        self.path, self.lineno, self.key, self.problem = path, line, key, problem


class ConfigErrors(ConfigError):
    """Several independent mistakes in one file, all reported at once, a line each, as a
    compiler does: a user fixes them in one pass, not one run at a time."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.lineno, first.key, first.problem)
        self.errors = errors
        self.message = "; ".join(e.message for e in errors)  # serve's one log line

    def line(self) -> str:
        return "\n".join(e.line() for e in self.errors)


class BinaryError(RefcntdError):
    """The binary to trace is missing, not ELF, or lacks the probed symbols."""


class ScriptError(BinaryError):
    """A script (#!) where an ELF file was read: never mapped executable itself."""


class EnvironmentProblem(RefcntdError):
    """Tracing is impossible here: privileges, kernel headers, tracefs, bcc."""

    exit_code = EXIT_INCOMPLETE


class ProbeError(RefcntdError):
    """A probe could not be placed or installed."""

    exit_code = EXIT_INCOMPLETE


class InputFileError(RefcntdError):
    """An input file is missing, not a regular file, too big, or not UTF-8; names the file."""
