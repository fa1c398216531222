"""Every numeric option is range-checked by argparse, before any analysis or kernel work."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from refcntd.cli import main as cli_main
from refcntd.cli.main import main

RUN = ["run", "--", "/bin/true"]
BAD = [
    ("--exitcode", "256", "0..255"), ("--exitcode", "-1", "0..255"),
    ("--exitcode", "1e3", "0..255"),
    ("--max-objects", "0", "1..4194304"), ("--max-objects", "-5", "1..4194304"),
    ("--max-objects", "99999999999", "1..4194304"),
    ("--max-stacks", "0", "1..262144"), ("--max-stacks", "1000000000", "1..262144"),
    ("--history-depth", "12", "power of two"), ("--history-depth", "512", "power of two"),
    ("--wait-descendants", "-1", "0..86400"), ("--wait-descendants", "nan", "0..86400"),
    ("--wait-descendants", "inf", "0..86400"),
]


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("option", "value", "allowed"), BAD)
def test_run_option_out_of_range(option: str, value: str, allowed: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(["run", f"{option}={value}", *RUN[1:]], capsys)
    assert option in line and allowed in line


@pytest.mark.parametrize("argv", [
    ["attach", "--binary", "/bin/true", "--pid", "0"],
    ["attach", "--binary", "/bin/true", "--pid", "-3"],
    ["attach", "--binary", "/bin/true", "--max-objects", "0"],
    ["check", "--binary", "/bin/true", "--pid", "99999999"],
    ["report", "x.json", "--exitcode", "256"],
])
def test_other_commands_check_ranges(argv: list[str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(argv, capsys)
    assert "must be" in line or "expected" in line


def test_bounds_themselves_are_accepted() -> None:
    from refcntd.cli.main import build_parser
    args = build_parser().parse_args(["run", "--exitcode", "255", "--max-objects", "4194304",
                                      "--max-stacks", "1", "--history-depth", "256",
                                      "--wait-descendants", "0", "--", "true"])
    assert (args.exitcode, args.max_objects, args.max_stacks, args.history_depth) == \
        (255, 4194304, 1, 256)
    assert build_parser().parse_args(["run", "--exitcode", "0", "--", "t"]).exitcode == 0


@pytest.mark.parametrize("argv", [
    ["run", "--json", "{missing}/r.json", "--", "/bin/true"],
    ["run", "--sarif", "{dir}", "--", "/bin/true"],
    ["run", "--junit", "/proc/no-such-file.xml", "--", "/bin/true"],
    ["attach", "--binary", "/bin/true", "--json", "{dir}"],
    ["report", "r.json", "--output", "{missing}/out"],
    ["report", "r.json", "--junit", "{readonly}/j.xml"],
    ["spec", "draft", "--library", "/bin/true", "--output", "{dir}"],
])
def test_output_paths_checked_before_the_command(argv: list[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    reached = []
    for name, command in cli_main.COMMANDS.items():
        monkeypatch.setattr(command, "run", lambda _args, name=name: reached.append(name))
    readonly = tmp_path / "ro"  # mounted last: nothing may fail before the umount below
    readonly.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "none", str(readonly)],
                             check=False, capture_output=True).returncode == 0
    if not mounted:  # not root: a mode the kernel enforces for us
        readonly.chmod(0o555)
    try:
        filled = [a.format(missing=tmp_path / "nope", dir=tmp_path, readonly=readonly)
                  for a in argv]
        line = one_error_line(filled, capsys)
    finally:
        subprocess.run(["umount", str(readonly)], check=False, capture_output=True)
    assert not reached and line.startswith("refcntd: argument --"), line


def test_output_path_check_leaves_nothing_behind(tmp_path: Path) -> None:
    from refcntd.cli.main import build_parser
    out = tmp_path / "r.json"
    assert build_parser().parse_args(["run", "--json", str(out), "--", "t"]).json == str(out)
    assert not out.exists()


@pytest.mark.parametrize("mode", [0o644, 0o000])
def test_command_not_executable_is_a_usage_error(mode: int, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cmd = tmp_path / "tool"
    cmd.write_bytes(Path("/bin/true").read_bytes())
    cmd.chmod(mode)
    assert "command not executable" in one_error_line(["run", "--", str(cmd)], capsys)
    assert "command not executable" in one_error_line(["run", "--", str(tmp_path)], capsys)
    assert "command not found" in one_error_line(["run", "--", str(tmp_path / "x")], capsys)


def test_attach_to_a_missing_pid_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    pid = 4194000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    line = one_error_line(["attach", "--binary", "/bin/true", "--pid", str(pid)], capsys)
    assert f"no process {pid}" in line
