"""program.kernel_choices: one decision per kernel feature (issue 40)."""

from __future__ import annotations

import pytest

from refcntd.errors import EnvironmentProblem
from refcntd.kernel import features
from refcntd.kernel.program import kernel_choices

ALL = dict(release="9.9.9", group_dead=True, btf=True, uprobe_pmu=True, ringbuf=True,
           attach_cookie=True, uprobe_multi=True)


def kernel(**missing: bool | None) -> features.Features:
    return features.Features(**{**ALL, **missing})


def test_a_kernel_with_everything_takes_no_fallback():
    choices = kernel_choices(kernel())
    assert choices.multi and choices.group_dead and not choices.notes and not choices.missing
    assert choices.cflags == ["-DREFCNTD_GROUP_DEAD=1"]
    choices.require()


def test_debian_6_1_falls_back_twice_and_says_so():
    choices = kernel_choices(kernel(group_dead=False, uprobe_multi=False))
    assert not choices.multi and not choices.group_dead and not choices.missing
    assert choices.cflags == ["-DREFCNTD_GROUP_DEAD=0"]
    assert choices.live_offsets is not None  # this machine's BTF has signal and live
    assert len(choices.notes) == 2 and all("9.9.9" in n for n in choices.notes)


def test_without_a_fallback_one_line_names_the_feature_and_a_kernel_with_it():
    choices = kernel_choices(kernel(ringbuf=False))
    with pytest.raises(EnvironmentProblem, match="lacks the BPF ring buffer.*Linux 5.8 has it"):
        choices.require()
    nothing = kernel_choices(kernel(group_dead=False, btf=False))
    assert "neither sched_process_exit's group_dead" in nothing.missing[0]


def test_unprobed_facts_are_taken_as_present():
    choices = kernel_choices(kernel(uprobe_multi=None, ringbuf=None, group_dead=None))
    assert choices.multi and choices.group_dead and not choices.missing


def test_tracefs_format_fields(tmp_path):
    event = tmp_path / "events" / "sched" / "sched_process_exit"
    event.mkdir(parents=True)
    (event / "format").write_text(
        "name: sched_process_exit\nformat:\n"
        "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
        "\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n")
    assert features._tracepoint_field(tmp_path, "sched", "sched_process_exit", "pid") is True
    assert features._tracepoint_field(tmp_path, "sched", "sched_process_exit",
                                      "group_dead") is False
    assert features._tracepoint_field(None, "sched", "sched_process_exit", "pid") is None


def test_an_unknown_name_in_refcntd_kernel_without_is_refused(monkeypatch):
    monkeypatch.setenv(features.WITHOUT, "uprobe_multi,nonsense")
    features.current.cache_clear()
    try:
        with pytest.raises(EnvironmentProblem, match="no kernel feature nonsense"):
            features.current()
    finally:
        features.current.cache_clear()
