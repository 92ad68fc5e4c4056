"""The Prometheus endpoint holds a bounded number of connections, each for a bounded time."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from sidecar import metrics_server
from sidecar.metrics_server import MAX_CONNECTIONS, serve_metrics


def test_idle_connections_are_bounded_in_number_and_time(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit: 3,000 half-sent requests held 3,000 threads for good and /metrics stopped
    answering (prometheus_client's server has no timeout and no limit)."""
    monkeypatch.setattr(metrics_server._Handler, "timeout", 0.5)
    server = serve_metrics(0, "127.0.0.1")
    port = server.server_port
    threads_before = threading.active_count()
    held = []
    try:
        for _ in range(MAX_CONNECTIONS + 10):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # never finished
            held.append(s)
        time.sleep(0.3)
        assert threading.active_count() - threads_before <= MAX_CONNECTIONS
        time.sleep(0.8)  # past the timeout: the held ones are closed and their threads end
        assert threading.active_count() - threads_before <= 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            assert answer.status == 200
        assert "Traceback" not in capsys.readouterr().err  # a timeout is no error to print
    finally:
        for s in held:
            s.close()
        server.shutdown()
        server.server_close()
