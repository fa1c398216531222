"""The CI audit's inputs are checked before any work: a bad suppressions file names its
line (no BPF; the outputs are tested in test_cli_outputs.py, the audit of real runs in
tests/bpf/test_ci.py)."""

from __future__ import annotations

from conftest import assert_one_line_error, refcntd


def test_bad_suppression_file_names_its_line(tmp_path):
    rules = tmp_path / "supp.txt"
    rules.write_text("leak:ok\nfoo:bar\n")
    result = refcntd(["run", "--suppressions", str(rules), "--", "/bin/true"])
    assert_one_line_error(result, f"{rules}:2: foo:")


def test_bad_max_leaks_says_what_and_how(tmp_path):
    """Issue 41: the line read `--max-leaks:0: widget=x`, a file and line that are none."""
    for bad, why in (("widget=x", "N must be a whole number"), ("widget", "no TYPE=N")):
        result = refcntd(["run", "--max-leaks", bad, "--", "/bin/true"])
        assert result.returncode == 2
        assert_one_line_error(result, f"refcntd: --max-leaks '{bad}': {why} (give TYPE=N, e.g.")
        assert ":0:" not in result.stderr
