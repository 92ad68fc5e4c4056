"""The throttling proxy on its own (an echo server behind it) and the PROXIED listener config."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.exceptions import ConfigError
from sidecar.lab.chaos.proxy import ThrottlingProxy
from sidecar.lab.localkafka.broker import LocalKafka, free_port


class Upstream:
    """An echo server that also keeps everything it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                self.received += chunk
                writer.write(chunk)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            self.closed.set()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    up.server = await asyncio.start_server(up._echo, "127.0.0.1", 0)
    try:
        yield up
    finally:
        up.server.close()
        await up.server.wait_closed()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[ThrottlingProxy]:
    p = ThrottlingProxy(upstream_port=upstream.port)
    await asyncio.to_thread(p.start)
    try:
        yield p
    finally:
        await asyncio.to_thread(p.close)


async def _connect(
    proxy: ThrottlingProxy,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except ConnectionError:
        pass


async def test_forwards_bytes_both_ways_intact(proxy: ThrottlingProxy) -> None:
    reader, writer = await _connect(proxy)
    payload = bytes(range(256)) * 4096  # 1 MiB
    writer.write(payload)
    await writer.drain()
    echoed = await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    assert echoed == payload
    await _close(writer)
    stats = proxy.stats()
    assert stats.connections == 1
    assert stats.bytes == {"up": len(payload), "down": len(payload)}


async def test_latency_delays_each_direction(proxy: ThrottlingProxy) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"warm")
    await asyncio.wait_for(reader.readexactly(4), 5)
    proxy.set_latency(150)
    began = time.monotonic()
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
    assert time.monotonic() - began >= 0.29  # 150 ms up, 150 ms down
    # a delay line: many chunks in flight do not add up their latencies
    began = time.monotonic()
    for _ in range(10):
        writer.write(b"x" * 10)
        await writer.drain()
        await asyncio.sleep(0.01)
    await asyncio.wait_for(reader.readexactly(100), 5)
    assert time.monotonic() - began < 1.0
    await _close(writer)


async def test_rate_caps_the_bandwidth(proxy: ThrottlingProxy) -> None:
    proxy.set_rate(128 * 1024)
    reader, writer = await _connect(proxy)
    payload = b"r" * (128 * 1024)  # one second at the cap, each way (pipelined)
    began = time.monotonic()
    writer.write(payload)
    await writer.drain()
    await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    elapsed = time.monotonic() - began
    assert 0.9 <= elapsed < 5.0
    proxy.set_rate(None)
    began = time.monotonic()
    writer.write(payload)
    await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    assert time.monotonic() - began < 0.5
    await _close(writer)


async def test_stall_holds_bytes_keeps_connections_and_resumes_in_order(
    proxy: ThrottlingProxy, upstream: Upstream
) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"before|")
    assert await asyncio.wait_for(reader.readexactly(7), 5) == b"before|"
    proxy.stall()
    assert proxy.stalled
    writer.write(b"during-1|")
    await writer.drain()
    # a new connection is accepted while stalled; its bytes are held too
    reader2, writer2 = await _connect(proxy)
    writer2.write(b"second")
    await writer2.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(1), 0.6)
    assert bytes(upstream.received) == b"before|"
    writer.write(b"during-2|")
    await writer.drain()
    proxy.resume()
    assert await asyncio.wait_for(reader.readexactly(18), 5) == b"during-1|during-2|"
    assert await asyncio.wait_for(reader2.readexactly(6), 5) == b"second"
    writer.write(b"after")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"after"
    stats = proxy.stats()
    assert stats.connections == 2
    assert stats.stalls == 1
    assert stats.stalled_s >= 0.6
    await _close(writer)
    await _close(writer2)


async def test_bytes_sent_before_a_close_during_a_stall_still_arrive(
    proxy: ThrottlingProxy, upstream: Upstream
) -> None:
    _, writer = await _connect(proxy)
    proxy.stall()
    writer.write(b"last words")
    await writer.drain()
    await _close(writer)
    await asyncio.sleep(0.3)
    assert bytes(upstream.received) == b""
    proxy.resume()
    await asyncio.wait_for(upstream.closed.wait(), 5)
    assert bytes(upstream.received) == b"last words"


async def test_close_drops_connections_and_frees_the_port(upstream: Upstream) -> None:
    proxy = ThrottlingProxy(upstream_port=upstream.port)
    await asyncio.to_thread(proxy.start)
    reader, writer = await _connect(proxy)
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
    proxy.stall()
    await asyncio.to_thread(proxy.close)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the proxy hung up
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    await _close(writer)
    await asyncio.wait_for(upstream.closed.wait(), 5)
    proxy.close()  # twice is fine


async def test_an_unreachable_upstream_closes_the_client() -> None:
    proxy = ThrottlingProxy(upstream_port=free_port())
    await asyncio.to_thread(proxy.start)
    try:
        reader, writer = await _connect(proxy)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await _close(writer)
        assert proxy.stats().upstream_failures == 1
    finally:
        await asyncio.to_thread(proxy.close)


def test_control_arguments_are_checked() -> None:
    proxy = ThrottlingProxy(upstream_port=1)
    try:
        with pytest.raises(ValueError, match="latency must be >= 0 ms"):
            proxy.set_latency(-1)
        with pytest.raises(ValueError, match="rate must be > 0"):
            proxy.set_rate(0)
        proxy.stall()  # before start: applied directly
        assert proxy.stalled
    finally:
        proxy.close()


# ------------------------------------------------------------------ the broker's PROXIED listener


def test_proxied_listener_is_advertised_at_the_proxy(tmp_path: Path) -> None:
    broker = LocalKafka(
        tmp_path,
        tmp_path,
        port=19092,
        controller_port=19093,
        proxied_port=19094,
        proxied_advertised_port=29094,
    )
    props = broker._write_config().read_text()
    assert (
        "listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,"
        "PROXIED://127.0.0.1:19094\n" in props
    )
    assert (
        "advertised.listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,"
        "PROXIED://127.0.0.1:29094\n" in props
    )
    assert (
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT\n"
        in props
    )
    assert "inter.broker.listener.name=PLAINTEXT\n" in props
    assert broker.bootstrap_servers == "127.0.0.1:19092"
    assert broker.proxied_bootstrap_servers == "127.0.0.1:29094"
    again = LocalKafka.from_instance_dir(tmp_path, tmp_path)
    assert (again.proxied_port, again.proxied_advertised_port) == (19094, 29094)


def test_without_a_proxy_the_config_is_unchanged(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path, tmp_path, port=19092, controller_port=19093)
    props = broker._write_config().read_text()
    listeners = "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert f"\nlisteners={listeners}\nadvertised.listeners={listeners}\n" in props
    assert "PROXIED" not in props
    assert broker.proxied_bootstrap_servers is None


def test_proxied_ports_go_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="go together"):
        LocalKafka(tmp_path, tmp_path, proxied_port=19094)
