"""Running a bundled spec on a fixture program of our own that uses the real
library as Debian installs it, and comparing with the program's own books.

Each fixture prints `leak TYPE 0xADDR COUNT` for every object it leaks on
purpose and `double TYPE 0xADDR` before a real double unref: that is the
truth, counted by the program, not by refcntd.  `made TYPE 0xADDR`: an object
the library made of its own and leaks with one of those (seen through the
library's own hooks; its count is the library's, so any count holds).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from conftest import FIXTURES, cc, refcntd


@dataclass
class Outcome:
    returncode: int
    truth: dict[tuple[str, int], int]  # (type, address) -> count, from the program
    doubles: list[tuple[str, int]]
    made: set[tuple[str, int]]  # (type, address): the library's own, from the program
    leaks: dict[tuple[str, int], int]  # from refcntd's report
    anomalies: list[dict]
    process: dict
    report: dict
    stderr: str


def build(tmp_path: Path, source: str, pkgs: list[str], extra: list[str] | None = None) -> Path:
    """-O2, no frame pointers, stripped: as hostile as a release build."""
    flags = shlex.split(subprocess.run(["pkg-config", "--cflags", "--libs", *pkgs], check=True,
                                       capture_output=True, text=True).stdout)
    return cc(tmp_path / Path(source).stem, [FIXTURES / source],
              ["-O2", "-fomit-frame-pointer", "-s", *flags, *(extra or [])])


def trace(tmp_path: Path, spec: str | list[str], argv: list[str], env: dict | None = None,
          options: tuple[str, ...] = ()) -> Outcome:
    """`spec`: one, or several (--spec given once each); `options`: run's own."""
    json_path = tmp_path / f"{'-'.join(Path(a).name for a in argv)}.json"
    specs = [a for s in ([spec] if isinstance(spec, str) else spec) for a in ("--spec", s)]
    result = refcntd(["run", *options, *specs, "--", *argv], json_path, env=env)
    assert result.report is not None, result.stderr
    (process,) = [p for p in result.report["processes"] if p["pid"]][:1] or [None]
    truth, doubles, made = {}, [], set()
    for line in result.stdout.splitlines():
        words = line.split()
        if words[:1] == ["leak"]:
            truth[(words[1], int(words[2], 16))] = int(words[3])
        elif words[:1] == ["double"]:
            doubles.append((words[1], int(words[2], 16)))
        elif words[:1] == ["made"]:
            made.add((words[1], int(words[2], 16)))
    leaks = {(g["type"], int(i["address"], 16)): i["count"]
             for g in process["groups"] for i in g["instances"]}
    return Outcome(result.returncode, truth, doubles, made, leaks, process["anomalies"], process,
                   result.report, result.stderr)


# Losses of stacks only: the counts are whole (stacks through Debian's libraries,
# which have no frame pointers, are the stack walker's business, not the spec's).
STACK_ONLY = ("allocation stacks", "raw stacks")


def assert_counts_whole(out: Outcome) -> None:
    lost = {k: v for k, v in out.report["tracing"]["lost"].items()
            if not k.startswith(STACK_ONLY)}
    assert lost == {}, out.stderr


def assert_balanced(out: Outcome) -> None:
    """A clean program: nothing leaked, no anomaly, not even a note, no count lost."""
    assert out.leaks == {}, out.stderr
    assert out.anomalies == [], out.stderr
    assert_counts_whole(out)


def assert_exact_leaks(out: Outcome) -> None:
    assert out.truth, "the fixture leaked nothing: the test would prove nothing"
    assert {k: v for k, v in out.leaks.items() if k not in out.made} == out.truth, out.stderr
    assert {k for k, v in out.leaks.items() if k in out.made and v >= 1} == out.made, \
        out.stderr
    assert [a for a in out.anomalies if not a["separate"]] == [], out.stderr
    assert_counts_whole(out)


def assert_double_caught(out: Outcome, kinds: tuple[str, ...] = ("put-after-delete",)) -> None:
    (double,) = out.doubles
    caught = [(a["type"], int(a["address"], 16)) for a in out.anomalies if a["kind"] in kinds]
    assert caught == [double], out.stderr
