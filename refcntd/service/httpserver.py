"""The metrics endpoint: `/metrics` in Prometheus text format, a landing page at `/`."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app

from refcntd import __version__

LANDING = f"""<!doctype html>
<html><head><title>refcntd</title></head><body>
<h1>refcntd {__version__}</h1>
<p>Reference-count leak tracer. <a href="/metrics">Metrics</a></p>
</body></html>
""".encode()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # scrapes are not worth a log line each
        pass


def application(registry: CollectorRegistry) -> WSGIApplication:
    metrics: WSGIApplication = make_wsgi_app(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; see /metrics\n"]
    return app


def start(host: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """Serve in a daemon thread; raises OSError when the address cannot be bound."""
    server = make_server(host, port, application(registry), handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
