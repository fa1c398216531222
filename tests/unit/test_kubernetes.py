"""configs/kubernetes/: valid against the Kubernetes schemas (kubernetes-validate,
offline, strict: an unknown field fails), and saying what the systemd unit says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from refcntd.inputs.config import load_config

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "configs" / "kubernetes" / "refcntd-daemonset.yaml"
UNIT = REPO / "systemd" / "refcntd.service"
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def kind(name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == name]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_validates_strictly(version: str) -> None:
    docs = documents()
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet", "ServiceAccount"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_is_refused() -> None:
    """The check is real: strict validation rejects what the API server would drop."""
    daemonset = kind("DaemonSet")
    daemonset["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[0], strict=True)


def test_the_unit_s_capabilities_not_privileged() -> None:
    unit = UNIT.read_text()
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M)
    assert caps
    (container,) = kind("DaemonSet")["spec"]["template"]["spec"]["containers"]
    context = container["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert sorted("CAP_" + c for c in context["capabilities"]["add"]) == sorted(
        caps[1].split())


def test_host_pid_mounts_and_scrape_annotations_agree_with_the_config(tmp_path) -> None:
    pod = kind("DaemonSet")["spec"]["template"]
    spec = pod["spec"]
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/sys/kernel/tracing", "/sys/fs/bpf", "/etc/refcntd"} <= mounts
    config_file = tmp_path / "refcntd.yaml"
    config_file.write_text(kind("ConfigMap")["data"]["refcntd.yaml"])
    config = load_config(config_file)  # refcntd's own strict reader
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.listen_port == \
        container["ports"][0]["containerPort"]
    assert config.listen_host == "0.0.0.0"
    assert container["args"] == ["serve", "--config", "/etc/refcntd/refcntd.yaml"]
