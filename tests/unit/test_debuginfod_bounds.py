"""debuginfod downloads, bounded like elfutils' client (issue 28): size, time, scheme,
redirects, threads, cache cleaning.  Real HTTP and HTTPS servers on loopback.
"""

from __future__ import annotations

import http.server
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_symbolize import build_lib, split

from refcntd.binary.elf import read_build_id
from refcntd.symbolize.debuginfod import (
    HTTPS_ONLY,
    DebuginfodClient,
    Pending,
    clean_cache,
    url_problem,
)

Route = Callable[[http.server.BaseHTTPRequestHandler], None]


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    route: Route
    requests: list[str]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.requests.append(self.path)
        try:
            self.server.route(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def serve() -> Iterator[Callable[..., tuple[Server, str]]]:
    """serve(route, tls=None) -> (server, base URL)."""
    servers: list[Server] = []

    def start(route: Route, tls: ssl.SSLContext | None = None) -> tuple[Server, str]:
        srv = Server(("127.0.0.1", 0), Handler)
        srv.route, srv.requests = route, []
        if tls is not None:
            srv.socket = tls.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        scheme = "https" if tls else "http"
        return srv, f"{scheme}://127.0.0.1:{srv.server_address[1]}"
    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def answer(body: bytes, length: bool = True) -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        if length:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
    return route


def redirect(to: str) -> Route:
    def route(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", to + h.path)
        h.end_headers()
    return route


def client(tmp_path: Path, *urls: str, **bounds: float) -> DebuginfodClient:
    return DebuginfodClient(list(urls), tmp_path / "cache", **bounds)  # type: ignore[arg-type]


@pytest.fixture()
def served_debug(tmp_path: Path) -> tuple[str, bytes]:
    lib = build_lib(tmp_path / "lib")
    debug = split(lib, "served.debug")
    build_id = read_build_id(lib)
    assert build_id
    return build_id, debug.read_bytes()


def test_size_cap_from_the_header_and_while_reading(tmp_path, serve, served_debug):
    build_id, body = served_debug
    _, url = serve(answer(body))
    small = client(tmp_path, url, max_size=len(body) - 1)
    assert small.debuginfo(build_id) is None
    assert small.notes == [f"debuginfod {url}/buildid/{build_id}/debuginfo: {len(body)} bytes, "
                           f"over the size limit ({len(body) - 1})"]
    _, unannounced = serve(answer(body, length=False))
    small = client(tmp_path, unannounced, max_size=len(body) - 1)
    assert small.debuginfo(build_id) is None
    assert "over the size limit" in small.notes[0]
    assert not (tmp_path / "cache" / build_id / "debuginfo").exists()
    assert client(tmp_path, url, max_size=len(body)).debuginfo(build_id)  # at the cap: taken


def test_time_cap_on_a_server_that_trickles(tmp_path, serve, served_debug):
    """One byte every 50 ms never stalls a read, but the whole download has 1 s."""
    build_id, _ = served_debug

    def trickle(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        for _ in range(200):
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.05)
    _, url = serve(trickle)
    slow = client(tmp_path, url, total_s=1.0, wait_s=30)
    started = time.monotonic()
    assert slow.debuginfo(build_id) is None
    assert time.monotonic() - started < 3
    assert slow.notes == [f"debuginfod {url}/buildid/{build_id}/debuginfo: not complete within "
                          "the time limit (DEBUGINFOD_MAXTIME)"]


def test_maxsize_and_maxtime_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DEBUGINFOD_URLS", "https://debuginfod.example")
    monkeypatch.setenv("DEBUGINFOD_MAXSIZE", "1000")
    monkeypatch.setenv("DEBUGINFOD_MAXTIME", "7")
    from_env = DebuginfodClient.from_env()
    assert from_env is not None and (from_env.max_size, from_env.total_s) == (1000, 7)
    monkeypatch.setenv("DEBUGINFOD_MAXSIZE", "0")  # elfutils: 0 is no limit (ours: 4 GiB)
    monkeypatch.setenv("DEBUGINFOD_MAXTIME", "0")
    from_env = DebuginfodClient.from_env()
    assert from_env is not None and (from_env.max_size, from_env.total_s) == (4 << 30, 120)


@pytest.mark.parametrize("url,allowed", [
    ("https://debuginfod.debian.net", True), ("http://127.0.0.1:8002", True),
    ("http://[::1]:8002/", True), ("http://localhost:8002", True),
    ("http://debuginfod.debian.net", False), ("file:///etc", False), ("ftp://host/x", False),
    ("data:,x", False), ("https://", False), ("/usr/lib/debug", False)])
def test_only_https_or_loopback_http(url, allowed):
    assert url_problem(url) == (None if allowed else HTTPS_ONLY)


def test_file_url_is_never_opened(tmp_path, served_debug):
    build_id, body = served_debug
    served = tmp_path / "files" / "buildid" / build_id
    served.mkdir(parents=True)
    (served / "debuginfo").write_bytes(body)
    refused = client(tmp_path, f"file://{tmp_path / 'files'}")
    assert refused.urls == [] and refused.debuginfo(build_id) is None
    assert refused.notes == [f"debuginfod URL file://{tmp_path / 'files'} ignored: {HTTPS_ONLY}"]


@pytest.fixture()
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """A certificate for 127.0.0.1 that this process's clients trust (SSL_CERT_FILE)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_redirects_never_downgrade_nor_leave_https_or_loopback(tmp_path, serve, tls,
                                                                served_debug):
    build_id, body = served_debug
    plain, plain_url = serve(answer(body))
    _, secure_url = serve(answer(body), tls)
    assert client(tmp_path / "direct", secure_url).debuginfo(build_id)  # TLS works here
    for target, why in [(plain_url, "from https to http"),
                        ("file:///etc/passwd#", HTTPS_ONLY),
                        ("http://debuginfod.example", HTTPS_ONLY)]:
        _, redirecting = serve(redirect(target), tls)
        downgraded = client(tmp_path / "d", redirecting)
        assert downgraded.debuginfo(build_id) is None
        (note,) = downgraded.notes
        assert note.startswith(f"debuginfod {redirecting}/buildid/{build_id}/debuginfo: "
                               f"redirect to {target}") and note.endswith(f"refused ({why})")
    assert plain.requests == []  # the downgraded request was never sent
    _, upgrading = serve(redirect(secure_url))  # loopback http -> https: fine
    assert client(tmp_path / "u", upgrading).debuginfo(build_id)


def test_downloads_run_on_a_bounded_pool(tmp_path, serve):
    """Ten modules missing at once: two threads, three waiting, the rest go without."""
    release = threading.Event()

    def held(h: http.server.BaseHTTPRequestHandler) -> None:
        release.wait(10)
        h.send_response(404)
        h.end_headers()
    server, url = serve(held)
    busy = DebuginfodClient([url], tmp_path / "cache", wait_s=0.01, workers=2, backlog=3)
    before = named("debuginfod")
    outcomes = []
    for i in range(10):
        try:
            outcomes.append(busy.debuginfo(f"{i:02x}" * 20))
        except Pending:
            outcomes.append("pending")
    assert outcomes == ["pending"] * 5 + [None] * 5
    assert busy._pool.threads == named("debuginfod") - before == 2
    assert busy.notes == [f"debuginfod: 3 downloads already waiting; {f'{i:02x}' * 20} not "
                          "asked" for i in range(5, 10)]
    release.set()
    deadline = time.monotonic() + 10
    while any(busy.running(f"{i:02x}" * 20) for i in range(5)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.requests) == 5


def named(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == name)


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_cache_cleaned_like_elfutils(tmp_path):
    cache = tmp_path / "cache"
    old, used = cache / ("aa" * 20), cache / ("bb" * 20)
    for entry in (old, used):
        entry.mkdir(parents=True)
        (entry / "debuginfo").write_bytes(b"x")
        age(entry / "debuginfo", 8 * 86400)
    assert clean_cache(cache) == 0  # control files made with elfutils' defaults: not due yet
    assert (cache / "cache_clean_interval_s").read_text() == "86400\n"
    assert (cache / "max_unused_age_s").read_text() == "604800\n"
    reader = DebuginfodClient(["https://x.example"], cache)
    assert reader.cached("bb" * 20)  # used now: its atime is now
    age(cache / "cache_clean_interval_s", 86400)
    assert clean_cache(cache) == 1
    assert not old.exists() and (used / "debuginfo").exists()
    age(used / "debuginfo", 3600)
    (cache / "max_unused_age_s").write_text("60\n")
    assert clean_cache(cache) == 0  # the interval since the last round has not passed
    (cache / "cache_clean_interval_s").write_text("0\n")  # 0: every query
    assert clean_cache(cache) == 1 and not used.exists()


def test_cache_in_a_directory_others_may_write_is_not_used(tmp_path, serve, served_debug):
    build_id, body = served_debug
    _, url = serve(answer(body))
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    refused = DebuginfodClient([url], loose / "cache")
    assert refused.debuginfo(build_id) is None
    assert refused.notes == [f"debuginfod not used: cache {loose / 'cache'}: {loose} is "
                             "writable by group or others"]
