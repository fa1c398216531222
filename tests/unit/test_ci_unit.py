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


def test_a_lost_put_found_against_a_baseline_is_not_called_a_get():
    """Issue 41: the annotation said "got at process+0x9d (test.c:28)", line 28 being the
    put that is gone: against a baseline the culprit's path is the call that changed."""
    from refcntd.analysis.model import LeakedObject, LeakGroup
    from refcntd.analysis.pathops import Culprit
    from refcntd.outputs.ciformats import message
    from refcntd.outputs.policy import Finding
    from refcntd.symbolize.symbolizer import Frame

    put = Frame("/t/test", 0x119d, "process", 0x9d, "/src/test.c", 28)
    alloc = (Frame("/t/test", 0x1100, "widget_new", 4, "/src/test.c", 9),)
    lost = Culprit("missing put", put, (Frame("/t/test", 0x1010, "widget_unref", 3), put),
                   baseline="good.json")
    extra = Culprit("extra get", put, (put,), baseline="good.json")
    for culprit, said in ((lost, "the put lost at widget_unref+0x3 < process"),
                          (extra, "the extra get at process+0x9d (test.c:28)")):
        group = LeakGroup("widget", alloc, [LeakedObject(0x10, 1, 1, 0, 0)], culprits=[culprit])
        text = message(Finding("leak", "widget", alloc, 1, 1, [1], [group]))
        assert said in text and "got at" not in text, text
        assert "(found against good.json)" in text
