"""The Prometheus endpoint (``GUARDRAIL_METRICS__PROMETHEUS_PORT``), with bounds.

``prometheus_client.start_http_server`` starts a thread per connection and never
times one out: 3,000 connections that sent half a request held 3,000 threads and the
endpoint stopped answering (audit). This serves the same WSGI app with a socket
timeout per connection and at most ``MAX_CONNECTIONS`` at once (more are closed
at once); a scrape sends its request immediately and takes milliseconds.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["MAX_CONNECTIONS", "REQUEST_TIMEOUT_S", "serve_metrics"]

MAX_CONNECTIONS: Final = 32
REQUEST_TIMEOUT_S: Final = 5.0


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # StreamRequestHandler: a timeout on the connection's socket

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # a line per scrape is noise


class _BoundedServer(ThreadingWSGIServer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or went away: nothing to say (socketserver printed a
        traceback to stderr for each)."""
        del request, client_address

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve_metrics(port: int, host: str) -> _BoundedServer:
    """Serve the default registry on ``host:port`` from a daemon thread; the server."""
    server_class = type(
        "MetricsServer",
        (_BoundedServer,),
        {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET},
    )
    server: _BoundedServer = make_server(
        host, port, make_wsgi_app(REGISTRY), server_class, handler_class=_Handler
    )
    threading.Thread(target=server.serve_forever, name="prometheus", daemon=True).start()
    return server
