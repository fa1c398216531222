"""TLS and basic auth of the HTTP endpoint from an exporter-toolkit web configuration
file, over real sockets; and that file's errors name file, line and key."""

from __future__ import annotations

import base64
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Counter

from refcntd.errors import ConfigError
from refcntd.inputs.webconfig import WebOptions, with_web_config
from refcntd.service import httpserver


@pytest.fixture
def cert(tmp_path: Path) -> Path:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    return tmp_path / "cert.pem"


def web_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def get(url: str, context: ssl.SSLContext | None, auth: str | None = None) -> int:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_tls_and_basic_auth_from_a_web_config_file(tmp_path, cert):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path = web_file(tmp_path, f"tls_server_config:\n  cert_file: cert.pem\n"
                              f"  key_file: key.pem\nbasic_auth_users:\n  prom: {hashed}\n")
    web = with_web_config(WebOptions(), str(path))
    registry = CollectorRegistry()
    Counter("probe_hits", "test counter", registry=registry).inc()
    ready = httpserver.Readiness()
    ready.set()
    server = httpserver.start("127.0.0.1", 0, registry, ready, web=web)
    https = f"https://localhost:{server.server_port}/metrics"
    trusted = ssl.create_default_context(cafile=str(cert))
    try:
        assert get(https, trusted) == 401
        assert get(https, trusted, "prom:wrong") == 401
        assert get(https, trusted, "nobody:s3cret") == 401
        assert get(https, trusted, "prom:s3cret") == 200
        assert get(https, trusted, "prom:s3cret") == 200  # the verified digest is reused
        with pytest.raises(OSError):  # plain HTTP to the TLS port: no answer
            urllib.request.urlopen(f"http://localhost:{server.server_port}/metrics",
                                   timeout=10)
        assert get(https, trusted, "prom:s3cret") == 200  # and the server lives on
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("text", "where"), [
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: [x]\n",
     "web.yml:4: tls_server_config.cipher_suites: unknown key"),
    ("tls_server_config:\n  cert_file: c\n", "tls_server_config: missing required key"),
    ("basic_auth_users:\n  prom: plaintext\n",
     "web.yml:2: basic_auth_users.prom: the password of 'prom' is not a bcrypt hash"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n"
     "  client_auth_type: RequireAnyClientCert\n", "is not one of"),
])
def test_web_config_errors_name_file_line_and_key(tmp_path, text, where):
    with pytest.raises(ConfigError) as err:
        with_web_config(WebOptions(), str(web_file(tmp_path, text)))
    assert where in err.value.line()
