"""The container commands benchmarks/image.py runs are the ones the docs give
(docs/install.md's OCI image, docs/ci.md's GitLab job), changed only where this
machine needs it; and the results it committed are runs of the docs as they are."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import image  # noqa: E402

OTHER = image.Machine(["--runtime", "runc", "--ulimit", "nofile=1024:4096"],
                      ["--isolation", "chroot"], "localhost/other:tag", "other-name",
                      "/var/tmp/conf")
COMMANDS = ("install-run", "install-serve", "gitlab-build", "gitlab-run")


def undo(command: str, m: image.Machine) -> list[str]:
    """The words of an adapted command with `m`'s changes taken back out, word by word."""
    words = shlex.split(command)
    flags = m.run_flags if words[1] == "run" else m.build_flags
    assert words[2:2 + len(flags)] == flags
    words = words[:2] + words[2 + len(flags):]
    back = {m.tag: image.DOC_TAG, m.name: image.DOC_NAME}
    words = [back.get(w, w) for w in words]
    return [w.replace(f"{m.conf}:", f"{image.DOC_CONF}:", 1) for w in words]


def test_every_documented_container_command_is_found():
    docs = image.documented()
    assert set(docs) == {*COMMANDS, "install-config"}
    for name in ("install-run", "install-serve", "gitlab-run"):
        words = shlex.split(docs[name])
        assert words[:2] == ["podman", "run"] and "--pid=host" in words and \
            "--privileged" in words, docs[name]
        assert "/sys/kernel/tracing:/sys/kernel/tracing" in words and \
            "/sys/fs/bpf:/sys/fs/bpf" in words
    assert shlex.split(docs["gitlab-build"])[:2] == ["podman", "build"]


@pytest.mark.parametrize("name", COMMANDS)
def test_the_script_changes_only_what_this_machine_needs(name):
    doc = image.documented()[name]
    assert image.adapt(doc, image.Machine()) == doc  # the docs' own setting: as written
    adapted = image.adapt(doc, OTHER)
    assert adapted != doc
    assert undo(adapted, OTHER) == shlex.split(doc)


def test_the_gitlab_job_runs_install_md_s_ci_form_with_a_junit_file():
    docs = image.documented()
    job = shlex.split(docs["gitlab-run"])
    at = job.index("--junit")
    assert job[:at] + job[at + 2:] == shlex.split(docs["install-run"])


def test_the_documented_config_is_valid_and_names_the_host_s_file(tmp_path):
    from refcntd.inputs.config import load_config
    path = tmp_path / "refcntd.yaml"
    path.write_text(image.documented()["install-config"])
    (target,) = load_config(path).targets
    assert target.path == image.DOC_TARGET


def test_the_committed_results_are_runs_of_the_docs_as_they_are():
    """benchmarks/results/image.json ran the commands the docs give today: a change to
    a documented command without a new run of the script fails here."""
    result = json.loads((ROOT / "benchmarks/results/image.json").read_text())
    m = image.Machine(**result["adapt"])  # what the run changed, as it recorded it
    ran = {r["case"]: r for r in result["rows"]}
    docs = image.documented()
    for name in COMMANDS:
        assert ran[name]["command"] == image.adapt(docs[name], m), name
        assert ran[name]["ok"], name
    assert ran["install-serve"]["metrics"]["leaked"] == ran["install-serve"]["expected_leaks"]
