"""The daemon's configuration (/etc/refcntd/refcntd.yaml): targets, listen
address, report directory and retention.  Checked strictly before any kernel
work, with file, line and key in every error."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from refcntd.errors import ConfigError
from refcntd.inputs.spec import Spec, load_spec, load_specs
from refcntd.inputs.webconfig import WebOptions, web_section
from refcntd.inputs.yamlnodes import YNode, load_yaml

DEFAULT_CONFIG = Path("/etc/refcntd/refcntd.yaml")
# 9100-9999, Prometheus' exporter range, is fully allocated; see docs/service.md (Port).
DEFAULT_PORT = 10271
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
DEFAULT_REPORT_DIR = "/var/lib/refcntd/reports"
_DURATION = re.compile(r"^(\d+)(s|m|h|d)$")
_SIZE = re.compile(r"^(\d+)(B|KiB|MiB|GiB)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
COMM_MAX = 15  # bytes of a command name the kernel keeps (TASK_COMM_LEN, NUL aside)


@dataclass(frozen=True)
class Target:
    name: str
    path: str  # a path or a glob
    spec: Spec
    comm: tuple[str, ...] = ()  # only processes with one of these command names
    cgroup: str | None = None  # only processes in this cgroup (v2 path)
    history: tuple[str, ...] | None = None
    age_threshold_s: float = 300.0  # live objects older than this are counted apart
    max_type_labels: int = 100  # distinct `type` label values per target; the rest fold
    warm_up_s: float = 10.0  # objects a process made in its first seconds are not "older"
    # (file, line, key) of `cgroup:`, for the error when serve finds no such cgroup
    cgroup_at: tuple[str, int, str] = ("", 0, "cgroup")
    # a program target's processes held at _exit for leak kinds, as `run` holds its own
    leak_kinds: bool = True

    def signature(self) -> tuple[object, ...]:
        """What must stay equal for a reload to keep this target's kernel state."""
        return (self.path, self.spec.path, self.comm, self.cgroup, self.history,
                self.leak_kinds)


@dataclass(frozen=True)
class Retention:
    max_reports: int = 1000
    max_age_s: float = 7 * 86400.0
    max_bytes: int = 100 << 20


@dataclass(frozen=True)
class Config:
    path: str
    listen_host: str
    listen_port: int
    report_dir: str
    retention: Retention
    targets: tuple[Target, ...] = field(default_factory=tuple)
    web: WebOptions = field(default_factory=WebOptions)


def load_config(path: str | Path = DEFAULT_CONFIG) -> Config:
    root = load_yaml(Path(path), "config")
    top = root.mapping({"version", "listen", "report_dir", "retention", "targets", "web"},
                       {"version", "targets"})
    top["version"].integer(1, 1)
    host, port = _listen(top.get("listen"))
    report_dir = top["report_dir"].string() if "report_dir" in top else DEFAULT_REPORT_DIR
    retention = _retention(top["retention"]) if "retention" in top else Retention()
    targets: list[Target] = []
    for node in top["targets"].items():
        target = _target(node)
        if target.name in {t.name for t in targets}:
            raise node.fail(f"target name '{target.name}' is used twice")
        targets.append(target)
    web = web_section(top["web"]) if "web" in top else WebOptions()
    return Config(str(path), host, port, report_dir, retention, tuple(targets), web)


def _listen(node: YNode | None) -> tuple[str, int]:
    text = node.string() if node is not None else DEFAULT_LISTEN
    address = split_listen(text)
    if address is None:
        assert node is not None  # DEFAULT_LISTEN is valid
        raise node.fail(f"'{text}' is not HOST:PORT")
    return address


def split_listen(text: str) -> tuple[str, int] | None:
    """HOST:PORT ([::1]:PORT for IPv6) as (host, port); None when it is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        return None
    return host.strip("[]"), int(port)


def _retention(node: YNode) -> Retention:
    fields = node.mapping({"max_reports", "max_age", "max_bytes"})
    base = Retention()
    return Retention(
        fields["max_reports"].integer(1, 10**7) if "max_reports" in fields else base.max_reports,
        _duration(fields["max_age"]) if "max_age" in fields else base.max_age_s,
        _size(fields["max_bytes"]) if "max_bytes" in fields else base.max_bytes)


def _duration(node: YNode) -> float:
    m = _DURATION.match(str(node.scalar()))
    if not m:
        raise node.fail("expected a duration like 90s, 30m, 12h or 7d")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _size(node: YNode) -> int:
    m = _SIZE.match(str(node.scalar()))
    if not m:
        raise node.fail("expected a size like 500KiB, 100MiB or 2GiB")
    return int(m.group(1)) << {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30}[m.group(2)]


def _target(node: YNode) -> Target:
    fields = node.mapping({"name", "path", "spec", "comm", "cgroup", "history", "age_threshold",
                           "max_type_labels", "warm_up", "leak_kinds"}, {"name", "path"})
    name = fields["name"].string()
    if not _NAME.match(name):
        raise fields["name"].fail(f"'{name}' is not a name (letters, digits, _ . -)")
    path = fields["path"].string()
    if not path.startswith("/"):
        raise fields["path"].fail("must be an absolute path (a glob is allowed)")
    spec = _spec(fields["spec"]) if "spec" in fields else load_spec("perf-stubs")
    comm = tuple(c.string()[:COMM_MAX] for c in fields["comm"].items()) if "comm" in fields else ()
    cgroup = fields["cgroup"].string() if "cgroup" in fields else None
    if cgroup is not None and not cgroup.startswith("/"):
        raise fields["cgroup"].fail("a cgroup path starts with / (e.g. /system.slice/x.service)")
    key = fields.get("cgroup")
    cgroup_at = (key.path, key.line, key.key) if key is not None else Target.cgroup_at
    history = _history(fields["history"]) if "history" in fields else None
    age = _duration(fields["age_threshold"]) if "age_threshold" in fields else 300.0
    cap = fields["max_type_labels"].integer(1, 10000) if "max_type_labels" in fields else 100
    warm = _duration(fields["warm_up"]) if "warm_up" in fields else Target.warm_up_s
    kinds = fields["leak_kinds"].boolean() if "leak_kinds" in fields else Target.leak_kinds
    return Target(name, path, spec, comm, cgroup, history, age, cap, warm, cgroup_at, kinds)


def _spec(node: YNode) -> Spec:
    """A spec, or a list of them (as --spec given more than once)."""
    try:
        if isinstance(node.node, yaml.SequenceNode):
            names = [item.string() for item in node.items()]
            if not names:
                raise node.fail("expected a spec, or a list of specs")
            return load_specs(names)
        return load_spec(node.string())
    except ConfigError:
        raise
    except Exception as err:  # UsageError for an unknown bundled name
        raise node.fail(getattr(err, "message", str(err))) from None


def _history(node: YNode) -> tuple[str, ...] | None:
    """`true`/`all`, `false`, or a list of type names."""
    if isinstance(node.node, yaml.ScalarNode):
        value = node.scalar()
        if value is False or value is None:
            return None
        if value is True or value == "all":
            return ("all",)
    names = tuple(n.string() for n in node.items())
    if not names:
        raise node.fail("expected true, false, all, or a list of type names")
    return names
