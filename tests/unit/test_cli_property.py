"""Random argument vectors and random input files against every command (issue 18).

Property: no traceback, an exit status from the README's table, and a usage
error is exactly one line `refcntd: ...` on stderr.  Kernel work is out of
reach here (no root in unit tests): setup.prepare, the first kernel step of
run/attach/serve, is replaced by a RefcntdError, so what is exercised is all
the argument and input handling before it.  checkpoint/diff (HTTP clients of
a running serve) are left out.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refcntd.analysis.model import ProcessReport, RunResult
from refcntd.cli.main import main
from refcntd.errors import EnvironmentProblem
from refcntd.outputs import reportjson

DOCUMENTED = {0, 2, 23, 24}
OPTIONS = {
    "check": ["--binary", "--pid", "--spec", "--probe-mode", "--verbose", "--quiet"],
    "attach": ["--binary", "--pid", "--spec", "--json", "--history", "--history-depth",
               "--max-objects", "--max-stacks", "--probe-mode"],
    "run": ["--spec", "--json", "--history", "--history-depth", "--max-objects",
            "--max-stacks", "--wait-descendants", "--sarif", "--junit", "--suppressions",
            "--baseline", "--max-leaks", "--exitcode", "--source-root", "--strict", "--"],
    "report": ["--format", "--output", "--sarif", "--junit", "--suppressions", "--baseline",
               "--max-leaks", "--exitcode", "--source-root", "--strict"],
    "spec": ["draft", "--library", "--name", "--output"],
    "serve": ["--config", "--check", "--strict"],
}
NUMBERS = ["0", "-1", "1", "4", "255", "256", "16", "99999999999999999999", "1e3", "nan",
           "0x10", "", " "]


def inputs(tmp: Path) -> list[str]:
    """Hostile input files, one of each kind, and a few good ones."""
    files = {"latin1.yaml": b"version: \xe9\n", "empty.json": b"", "nul.json": b"\x00{}",
             "deep.json": b"[" * 5000, "list.json": b"[1, 2]",
             "spec.yaml": b"version: 1\nname: x\nroles: {}\n", "supp.txt": b"leak:x\nbad\n",
             "text.txt": "üñí\n".encode()}
    for name, data in files.items():
        (tmp / name).write_bytes(data)
    os.mkfifo(tmp / "fifo")
    (tmp / "dir").mkdir()
    saved = tmp / "saved.json"
    process = ProcessReport(1, "x", [], "exited")
    reportjson.write_json(RunResult("run", "perf-stubs", "x", [process]), str(saved))
    return [str(tmp / n) for n in files] + [str(tmp / "fifo"), str(tmp / "dir"), str(saved),
                                           "/bin/true", "/dev/null", str(tmp / "missing")]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return inputs(tmp_path_factory.mktemp("inputs"))


def argv_for(command: str, pool: list[str]) -> st.SearchStrategy[list[str]]:
    words = st.text(st.characters(exclude_characters="\x00"), max_size=8)  # execve: no NUL
    token = st.one_of(st.sampled_from(OPTIONS[command]), st.sampled_from(pool),
                      st.sampled_from(NUMBERS), words,
                      st.sampled_from(["text", "sarif", "junit", "github", "folded", "all",
                                       "entry", "get=callsites", "dso=3", "*=x", "perf-stubs"]))
    return st.lists(token, max_size=8).map(lambda rest: [command, *rest])


def no_kernel(*_: object) -> None:
    raise EnvironmentProblem("kernel work reached (stopped by the test)")


EXAMPLES = int(os.environ.get("REFCNTD_PROPERTY_EXAMPLES", "150"))  # more for a bug hunt


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_argv_and_files(data: st.DataObject, pool: list[str], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("refcntd.kernel.setup.prepare", no_kernel)
    monkeypatch.chdir(tmp_path)  # outputs named by random text land here
    command = data.draw(st.sampled_from(sorted(OPTIONS)))
    argv = data.draw(argv_for(command, pool))
    try:
        code = main(argv)
    except SystemExit as exit_:  # only argparse's --help / --version, which print and exit 0
        code = exit_.code if isinstance(exit_.code, int) else 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert code in DOCUMENTED, (argv, code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("refcntd: "), (argv, err)
