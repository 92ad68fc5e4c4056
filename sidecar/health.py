"""Liveness and readiness over plain HTTP (asyncio streams; no web framework).

``GET /livez``  -> 200 while the event loop runs and nothing fatal happened (a
                   publish error that retrying cannot fix: the pod should restart).
``GET /readyz`` -> 200 when the broker is connected, partitions are assigned and
                   models are loaded; 503 with the failing checks otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson

from sidecar.exceptions import ConfigError

Check = Callable[[], dict[str, bool]]

# a probe sends its request line at once; anyone else holding a connection open costs a
# file descriptor each (audit: ~1,100 half-sent connections ran a pod with a 1,024-file
# limit out of descriptors, failed its liveness probe and flooded its log)
MAX_WAITING = 64  # connections waiting for their request line; past it the oldest is closed
REQUEST_LINE_TIMEOUT_S = 2.0
MAX_REQUEST_LINE = 8_192  # bytes; a longer line is refused (it raised, logged per connection)


class HealthServer:
    def __init__(
        self, host: str, port: int, readiness: Check, liveness: Check | None = None
    ) -> None:
        self._host = host
        self._port = port
        self._readiness = readiness
        self._liveness = liveness
        self._server: asyncio.Server | None = None
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self.evicted = 0  # connections closed to make room (tests read it)

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle, self._host, self._port, limit=MAX_REQUEST_LINE
            )
        except OSError as exc:  # a port in use, an address not on this host, a bad name
            raise ConfigError(
                f"the health endpoints cannot listen on {self._host}:{self._port}: {exc} "
                "(GUARDRAIL_HTTP__HOST: an address of this host, e.g. 0.0.0.0 or ::; "
                "GUARDRAIL_HTTP__PORT: a free port)"
            ) from None

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._waiting) >= MAX_WAITING:  # room for this one: the oldest idle one goes
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.abort()
            self.evicted += 1
        self._waiting[writer] = None
        try:
            try:
                async with asyncio.timeout(REQUEST_LINE_TIMEOUT_S):
                    line = await reader.readline()
            finally:
                self._waiting.pop(writer, None)
            parts = line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            body: dict[str, Any]
            if path.startswith("/livez"):
                checks = self._liveness() if self._liveness is not None else {}
                live = all(checks.values())
                status, body = (200 if live else 503), {"live": live, "checks": checks}
            elif path.startswith("/readyz"):
                checks = self._readiness()
                ready = all(checks.values())
                status, body = (200 if ready else 503), {"ready": ready, "checks": checks}
            else:
                status, body = 404, {"error": "not found", "paths": ["/livez", "/readyz"]}
            payload = orjson.dumps(body)
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode("ascii")
                + payload
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass  # no request line in time, a line over the limit, a connection cut short
        finally:
            writer.close()
