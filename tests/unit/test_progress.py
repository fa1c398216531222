"""Progress and timings on stderr: a bar on a terminal, one line per long stage
otherwise, durations with --verbose, nothing with --quiet."""

from __future__ import annotations

import io
import os
import time

import pytest
from conftest import FIXTURES, cc, refcntd

from refcntd import progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _long_stage(reporter: progress.Reporter, name: str = "scanning") -> None:
    reporter.begin(name)
    reporter.advance(3, 10)
    time.sleep(0.3)
    reporter.advance(5, 10)
    reporter.end()


@pytest.fixture(autouse=True)
def short_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.05)


def test_one_line_per_long_stage_without_a_terminal() -> None:
    out = io.StringIO()
    _long_stage(progress.Reporter(quiet=False, stream=out))
    assert out.getvalue() == "refcntd: scanning...\n"


def test_a_bar_on_a_terminal_erased_at_the_end() -> None:
    out = Tty()
    _long_stage(progress.Reporter(quiet=False, stream=out))
    text = out.getvalue()
    assert "refcntd: scanning [#########....................." in text
    assert "5/10" in text and text.endswith("\r\033[K")


def test_short_stages_are_silent_and_quiet_is_silent() -> None:
    out = io.StringIO()
    reporter = progress.Reporter(quiet=False, stream=out)
    reporter.begin("fast")
    reporter.end()
    _long_stage(progress.Reporter(quiet=True, stream=out))
    assert out.getvalue() == ""


def test_verbose_prints_every_duration() -> None:
    out = io.StringIO()
    reporter = progress.Reporter(verbose=True, quiet=False, stream=out)
    reporter.begin("fast")
    reporter.end()
    assert out.getvalue().startswith("refcntd: fast: 0.")
    assert [name for name, _ in reporter.timings] == ["fast"]


def test_check_verbose_and_quiet(tmp_path) -> None:
    exe = cc(tmp_path / "clones", [FIXTURES / "clones.c"], ["-O3"])
    env = dict(os.environ, REFCNTD_CACHE=str(tmp_path / "cache"))
    args = ["check", "--binary", str(exe), "--spec", "example-objapi"]
    loud = refcntd([*args, "--verbose"], env=env)
    assert "refcntd: ELF/DWARF analysis: " in loud.stderr
    assert f"refcntd: DWARF answers for {exe}: computed" in loud.stderr
    quiet = refcntd([*args, "--quiet"], env=env)
    assert quiet.stderr == ""
    cached = loud.stdout.replace("answers: computed", "answers: from the analysis cache")
    assert quiet.stdout == cached
    both = refcntd(["check", "--quiet", "--verbose", "--binary", str(exe)])
    assert both.returncode == 2 and "not allowed with" in both.stderr
