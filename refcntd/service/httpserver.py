"""The HTTP endpoint of `serve` and `attach --listen`: `/metrics`, `/status`, a landing
page, and the routes of `service/checkpoint.py`.

It runs as root on a host whose other users, and whose browsers' web pages, are not
trusted (SECURITY.md). So, as node_exporter with exporter-toolkit and Go's http.Server do:
- a request's whole head must arrive within one deadline (Go's ReadHeaderTimeout), not
  a timeout per read that a client can renew byte by byte;
- at most `max_connections` are served at once; the next is answered 503 and closed;
- the Host header must name the listen address (or a configured name): a DNS-rebinding
  page cannot reach the routes, and a request with a foreign Origin is refused;
- TLS and basic auth come from an exporter-toolkit web configuration file.
Until the probes are attached `/metrics` answers 503, so a scrape never reports an
empty target as healthy.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app

from refcntd import __version__
from refcntd.inputs.webconfig import Tls, WebOptions
from refcntd.service.scrapeclock import ScrapeClock

log = logging.getLogger("refcntd")
WRITE_TIMEOUT_S = 30.0  # per send once the head is read: a large /live body to a slow reader
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"

LANDING = f"""<!doctype html>
<html><head><title>refcntd</title></head><body>
<h1>refcntd {__version__}</h1>
<p>Reference-count leak tracer. <a href="/metrics">Metrics</a>, <a href="/status">status</a></p>
</body></html>
""".encode()


class _Deadline:
    """A request's input read straight from the socket, every read ending by one
    deadline: each recv waits at most the time left, so a head dribbled a byte at a time
    still ends on time (a buffered file's readline would renew a per-recv timeout)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self.deadline = sock, deadline
        self._buf = b""

    def _fill(self) -> bool:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request head deadline passed")
        self._sock.settimeout(left)
        chunk = self._sock.recv(65536)
        self._buf += chunk
        return bool(chunk)

    def readline(self, limit: int = -1) -> bytes:
        cap = limit if limit >= 0 else 1 << 20
        while b"\n" not in self._buf[:cap] and len(self._buf) < cap and self._fill():
            pass
        end = self._buf.find(b"\n", 0, cap)
        cut = end + 1 if end >= 0 else min(cap, len(self._buf))
        line, self._buf = self._buf[:cut], self._buf[cut:]
        return line

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self._buf) < size) and self._fill():
            pass
        cut = len(self._buf) if size < 0 else size
        data, self._buf = self._buf[:cut], self._buf[cut:]
        return data

    def close(self) -> None:
        pass


class _Handler(WSGIRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        deadline = time.monotonic() + self.server.web.header_timeout_s
        if isinstance(self.connection, ssl.SSLSocket):  # the handshake counts against it
            self.connection.settimeout(self.server.web.header_timeout_s)
            self.connection.do_handshake()
        self.rfile = _Deadline(self.connection, deadline)  # type: ignore[assignment]

    def get_environ(self) -> WSGIEnvironment:
        env = super().get_environ()
        self.connection.settimeout(WRITE_TIMEOUT_S)  # the head is in: reply at its pace
        assert isinstance(self.rfile, _Deadline)
        self.rfile.deadline = time.monotonic() + WRITE_TIMEOUT_S  # a body, if any
        return env

    def log_message(self, *args: object) -> None:  # scrapes are not worth a log line each
        pass


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `web.max_connections` of them."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], web: WebOptions) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.web = web
        self._slots = threading.BoundedSemaphore(web.max_connections)
        self.refused = 0  # connections answered 503 because every slot was busy
        super().__init__(address, _Handler)
        if web.tls is not None:
            self.socket = _tls_context(web.tls).wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            with _quietly():
                request.setblocking(False)
                request.send(BUSY)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that times out, resets or fails the TLS handshake costs its own
        connection and a debug line, never a traceback on the daemon's stderr."""
        log.debug("HTTP connection from %s dropped", client_address, exc_info=True)


class _quietly:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, *_rest: object) -> bool:
        return kind is not None and issubclass(kind, OSError)  # type: ignore[arg-type]


def _tls_context(tls: Tls) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if tls.min_version == "TLS13"
                           else ssl.TLSVersion.TLSv1_2)
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        ctx.load_verify_locations(tls.client_ca_file)
    ctx.verify_mode = {"RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
                       "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL}.get(
                           tls.client_auth_type, ssl.CERT_NONE)
    return ctx


class Readiness:
    """Set once the probes are attached; `/metrics` is 503 before."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def __bool__(self) -> bool:
        return self._event.is_set()


# path -> f(method, query) -> (HTTP status line, content type, body)
Routes = dict[str, Callable[[str, str], tuple[str, str, bytes]]]


class Gate:
    """Who may be answered: the Host and Origin checks and basic auth."""

    def __init__(self, host: str, web: WebOptions) -> None:
        self.web = web
        self.names = {host.lower(), *(h.lower() for h in web.hostnames)}
        self.any_address = host in ("", "0.0.0.0", "::")
        if self.any_address or _is_loopback(host):
            self.names.update(LOOPBACK_NAMES)
        if self.any_address:
            self.names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
        self._verified: set[bytes] = set()  # digests of credentials bcrypt already accepted

    def refusal(self, environ: WSGIEnvironment) -> tuple[str, bytes] | None:
        """None when the request may go on; else the status line and the reason."""
        host = environ.get("HTTP_HOST")
        if host is not None and not self._known(_host_name(host)):
            return "403 Forbidden", b"refcntd: unknown Host (set web.hostnames)\n"
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and not self._known(urlsplit(origin).hostname or ""):
            return "403 Forbidden", b"refcntd: cross-origin request refused\n"
        if environ.get("HTTP_SEC_FETCH_SITE") == "cross-site":
            return "403 Forbidden", b"refcntd: cross-site request refused\n"
        if self.web.users and not self._authorized(environ.get("HTTP_AUTHORIZATION", "")):
            return "401 Unauthorized", b"refcntd: basic auth required\n"
        return None

    def _known(self, name: str) -> bool:
        name = name.lower().strip("[]")
        if name in self.names:
            return True
        return self.any_address and _is_ip(name)  # any of the host's addresses

    def _authorized(self, header: str) -> bool:
        import bcrypt
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.web.users.get(user)
        if hashed is None:
            return False
        # bcrypt costs ~50 ms by design: a scrape every 15 s pays it once, not each time
        digest = hashlib.sha256(hashed + b"\0" + password.encode()).digest()
        if digest in self._verified:
            return True
        if bcrypt.checkpw(password.encode(), hashed):
            self._verified.add(digest)
            return True
        return False


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    return host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)


def application(registry: CollectorRegistry, ready: Readiness,
                status: Callable[[], dict[str, Any]] = dict,
                routes: Routes | None = None, gate: Gate | None = None,
                clock: ScrapeClock | None = None) -> WSGIApplication:
    metrics: WSGIApplication = make_wsgi_app(registry)

    def timed(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Each reader's requests feed `clock`: when the next is due (scrapeclock.py).
        The body is built here, not while the server writes it."""
        if clock is None:
            return app(environ, start_response)
        clock.started(environ.get("REMOTE_ADDR", ""), environ.get("HTTP_USER_AGENT", ""),
                      environ.get("PATH_INFO", "/"))
        try:
            return list(app(environ, start_response))
        finally:
            clock.ended()

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        refused = gate.refusal(environ) if gate is not None else None
        if refused is not None:
            line, reason = refused
            headers = [("Content-Type", "text/plain")]
            if line.startswith("401"):
                headers.append(("WWW-Authenticate", 'Basic realm="refcntd"'))
            start_response(line, headers)
            return [reason]
        path = environ.get("PATH_INFO", "/")
        if routes and path in routes:
            line, ctype, body = routes[path](environ.get("REQUEST_METHOD", "GET"),
                                             environ.get("QUERY_STRING", ""))
            start_response(line, [("Content-Type", ctype)])
            return [body]
        if path == "/metrics":
            if not ready:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"refcntd: probes not attached yet\n"]
            return metrics(environ, start_response)
        if path == "/status":
            body = json.dumps({"ready": bool(ready), **status()}, indent=2).encode() + b"\n"
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; see /metrics\n"]
    return timed


def start(host: str, port: int, registry: CollectorRegistry, ready: Readiness,
          status: Callable[[], dict[str, Any]] = dict, routes: Routes | None = None,
          web: WebOptions | None = None, clock: ScrapeClock | None = None) -> WSGIServer:
    """Serve in a daemon thread; raises OSError when the address cannot be bound or a
    TLS file cannot be read."""
    web = web if web is not None else WebOptions()
    server = _Server((host, port), web)
    server.set_app(application(registry, ready, status, routes, Gate(host, web), clock))
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
