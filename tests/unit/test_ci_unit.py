"""The CI audit: exit codes, SARIF / JUnit / GitHub outputs, suppressions, baselines."""

from __future__ import annotations

from conftest import assert_one_line_error, refcntd

# https://docs.github.com/actions/using-workflows/workflow-commands-for-github-actions












def test_bad_suppression_file_names_its_line(tmp_path):
    rules = tmp_path / "supp.txt"
    rules.write_text("leak:ok\nfoo:bar\n")
    result = refcntd(["run", "--suppressions", str(rules), "--", "/bin/true"])
    assert_one_line_error(result, f"{rules}:2: foo:")


