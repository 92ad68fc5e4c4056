"""The health endpoints answer the kubelet's probes whoever else holds connections open."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sidecar.health import MAX_WAITING, HealthServer


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 2.0)
    writer.close()
    return answer


async def test_a_probe_is_answered_while_many_idle_connections_are_held() -> None:
    """Audit: ~1,100 half-sent connections ran a pod out of file descriptors and its
    liveness probe failed. Past MAX_WAITING idle ones, the oldest is closed for the new."""
    server = HealthServer("127.0.0.1", 0, lambda: {"ok": True}, lambda: {"ok": True})
    await server.start()
    held = []
    try:
        for _ in range(MAX_WAITING * 3):
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /li")  # never finished
            held.append(writer)
        await asyncio.sleep(0.2)
        answer = await _get(server.port, "/livez")
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert server.evicted >= MAX_WAITING * 2
    finally:
        for writer in held:
            writer.close()
        await server.stop()


async def test_an_overlong_request_line_is_closed_without_an_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It raised ValueError in the handler: an ERROR traceback per connection (2.4 MB of log
    for 2,000 requests)."""
    server = HealthServer("127.0.0.1", 0, lambda: {"ok": True})
    await server.start()
    try:
        with caplog.at_level(logging.ERROR):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /" + b"A" * 70_000 + b"\r\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 2.0) == b""  # closed, no answer
            writer.close()
            await asyncio.sleep(0.1)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert (await _get(server.port, "/readyz")).startswith(b"HTTP/1.1 200 OK")
    finally:
        await server.stop()
