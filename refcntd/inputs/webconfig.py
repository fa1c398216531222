"""Who may talk to the HTTP endpoint of `serve` and `attach --listen`, and how.

Two sources. The daemon's own settings (`web:` in refcntd.yaml, `--web-*` options
of attach): whether state-changing routes exist (off by default, like Prometheus'
`--web.enable-lifecycle`), whether command lines are shown, which Host names are
accepted, how many connections are served at once. And an exporter-toolkit web
configuration file (`web.config_file`, `--web-config-file`): TLS and basic auth in
the same file node_exporter reads, so a fleet keeps one file per host for every
exporter. Only the keys refcntd really applies are accepted; any other is an error
naming the file, line and key, never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from refcntd.inputs.yamlnodes import YNode, load_yaml

DEFAULT_MAX_CONNECTIONS = 64
HEADER_TIMEOUT_S = 10.0  # the whole request head, like Go's ReadHeaderTimeout
# exporter-toolkit's client_auth_type values that Python's ssl can enforce; its
# RequestClientCert and RequireAnyClientCert accept an unverified certificate, which
# Python's ssl cannot do, so they are refused rather than silently made stricter.
CLIENT_AUTH = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
TLS_VERSIONS = ("TLS12", "TLS13")


@dataclass(frozen=True)
class Tls:
    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"


@dataclass(frozen=True)
class WebOptions:
    enable_checkpoint: bool = False  # POST /checkpoint
    show_cmdline: bool = False  # command lines of traced processes in /live and /diff
    hostnames: tuple[str, ...] = ()  # Host names accepted besides the listen address
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = HEADER_TIMEOUT_S
    config_file: str | None = None
    tls: Tls | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # name -> bcrypt hash


def web_section(node: YNode) -> WebOptions:
    """`web:` of refcntd.yaml."""
    f = node.mapping({"enable_checkpoint", "show_cmdline", "hostnames", "max_connections",
                      "config_file"})
    options = WebOptions(
        enable_checkpoint=f["enable_checkpoint"].boolean() if "enable_checkpoint" in f else False,
        show_cmdline=f["show_cmdline"].boolean() if "show_cmdline" in f else False,
        hostnames=tuple(h.string() for h in f["hostnames"].items()) if "hostnames" in f else (),
        max_connections=(f["max_connections"].integer(1, 10000) if "max_connections" in f
                         else DEFAULT_MAX_CONNECTIONS))
    if "config_file" in f:
        return with_web_config(options, f["config_file"].string())
    return options


def with_web_config(options: WebOptions, path: str) -> WebOptions:
    """`options` plus the TLS and users of an exporter-toolkit web configuration file."""
    top = load_yaml(Path(path), "web configuration").mapping(
        {"tls_server_config", "basic_auth_users"})
    tls = _tls(top["tls_server_config"], Path(path).parent) if "tls_server_config" in top \
        else None
    users = _users(top["basic_auth_users"]) if "basic_auth_users" in top else {}
    return replace(options, config_file=path, tls=tls, users=users)


def _tls(node: YNode, base: Path) -> Tls:
    f = node.mapping({"cert_file", "key_file", "client_ca_file", "client_auth_type",
                      "min_version"}, {"cert_file", "key_file"})
    auth = f["client_auth_type"].string() if "client_auth_type" in f else "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise f["client_auth_type"].fail(f"'{auth}' is not one of {', '.join(CLIENT_AUTH)}")
    version = f["min_version"].string() if "min_version" in f else "TLS12"
    if version not in TLS_VERSIONS:
        raise f["min_version"].fail(f"'{version}' is not one of {', '.join(TLS_VERSIONS)}")
    ca = str(base / f["client_ca_file"].string()) if "client_ca_file" in f else None
    if auth in ("RequireAndVerifyClientCert", "VerifyClientCertIfGiven") and ca is None:
        raise node.fail(f"client_auth_type {auth} needs client_ca_file")
    # relative paths are relative to the web configuration file, as exporter-toolkit does
    return Tls(str(base / f["cert_file"].string()), str(base / f["key_file"].string()), ca,
               auth, version)


def _users(node: YNode) -> dict[str, bytes]:
    import bcrypt
    users: dict[str, bytes] = {}
    for name, value in node.pairs():
        hashed = value.string().encode()
        try:
            bcrypt.checkpw(b"", hashed)  # a malformed hash raises here, not on a request
        except ValueError:
            raise value.fail(f"the password of '{name}' is not a bcrypt hash "
                             "(htpasswd -nBC 10 \"\" | tr -d ':\\n')") from None
        users[name] = hashed
    return users
