"""The metrics endpoint: `/metrics` in Prometheus text format, `/status`, a landing page.

A thread per connection with a read timeout: one idle or slow client can
never block another scrape.  Until the probes are attached `/metrics`
answers 503, so a scrape never reports an empty target as healthy.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app

from refcntd import __version__

REQUEST_TIMEOUT_S = 10.0

LANDING = f"""<!doctype html>
<html><head><title>refcntd</title></head><body>
<h1>refcntd {__version__}</h1>
<p>Reference-count leak tracer. <a href="/metrics">Metrics</a>, <a href="/status">status</a></p>
</body></html>
""".encode()


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # socket timeout: an idle connection is dropped, not waited on

    def log_message(self, *args: object) -> None:  # scrapes are not worth a log line each
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


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


def application(registry: CollectorRegistry, ready: Readiness,
                status: Callable[[], dict[str, Any]] = dict,
                routes: Routes | None = None) -> WSGIApplication:
    metrics: WSGIApplication = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
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
    return app


def start(host: str, port: int, registry: CollectorRegistry, ready: Readiness,
          status: Callable[[], dict[str, Any]] = dict, routes: Routes | None = None
          ) -> WSGIServer:
    """Serve in a daemon thread; raises OSError when the address cannot be bound."""
    server = make_server(host, port, application(registry, ready, status, routes),
                         server_class=_ThreadingServer, handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
