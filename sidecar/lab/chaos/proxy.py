"""A throttling TCP proxy on loopback: added latency, a bandwidth cap and full stalls.

The proxy listens on ``127.0.0.1`` (a port of its own, bound at construction so
it can be advertised before anything starts) and forwards every connection to
one upstream port. It runs in its own thread with its own event loop, so the
code that drives it (an asyncio scenario, a test) and the processes whose
traffic it carries are unaffected by its work; the control methods are plain
thread-safe calls.

Per direction, each connection is a reader feeding a bounded queue and a writer
draining it, so the faults behave like a slow link rather than a slow client:

* latency: every chunk is delivered ``latency`` after it was read (a delay
  line, so throughput is not divided by the latency);
* rate: one token bucket per direction, shared by all connections (one link),
  paces the bytes written; chunks are cut into slices so pacing stays smooth;
* stall: nothing is written in either direction; connections stay open, new
  ones are accepted and connected upstream, bytes are held (up to the queue
  bound, after which TCP flow control pushes back on the sender) and delivered
  in order on ``resume``. A connection closed by one side during a stall still
  gets its held bytes delivered before the close is passed on, as TCP would.

``close`` stops accepting, cancels every connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

from guardrail_client.aio import cancel_and_wait
from sidecar.exceptions import ProxyError

READ_BYTES = 64 * 1024
SLICE_BYTES = 16 * 1024  # pacing granularity under a rate limit
QUEUE_CHUNKS = 64  # per direction and connection: at most 4 MiB held before TCP pushes back
CONTROL_TIMEOUT_S = 5.0


class Direction(StrEnum):
    UP = "up"  # client -> upstream
    DOWN = "down"  # upstream -> client


@dataclass
class ProxyStats:
    """Counters, read with ``ThrottlingProxy.stats()`` (a copy)."""

    connections: int = 0  # accepted since start
    open_connections: int = 0
    upstream_failures: int = 0  # accepted but the upstream refused
    bytes: dict[str, int] = field(default_factory=lambda: {d.value: 0 for d in Direction})
    stalls: int = 0
    stalled_s: float = 0.0


class _Bucket:
    """A paced serial link: each write reserves its transmission time after the last one."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self._free_at = 0.0

    def delay(self, n: int, now: float) -> float:
        """Seconds to wait before ``n`` bytes have gone through at the current rate."""
        if self.rate is None:
            return 0.0
        self._free_at = max(now, self._free_at) + n / self.rate
        return self._free_at - now


_EOF = b""


class ThrottlingProxy:
    """``127.0.0.1:port`` -> ``upstream_host:upstream_port`` with latency, rate and stalls."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(("127.0.0.1", port))
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.port = int(self._sock.getsockname()[1])
        self._latency_s = 0.0
        self._stalled = False
        self._stalled_since = 0.0
        self._buckets = {d: _Bucket() for d in Direction}
        self._stats = ProxyStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._flowing: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 10.0) -> None:
        """Serve from a thread of its own; returns once the proxy accepts connections."""
        if self._thread is not None:
            return
        if self._closed:
            raise ProxyError(f"the proxy on {self.address} was closed; make a new one")
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise ProxyError(f"the proxy on {self.address} did not start in {timeout_s}s")
        if self._failure is not None:
            raise ProxyError(f"the proxy on {self.address} failed to start: {self._failure}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, drop every connection, stop the loop and join the thread."""
        if self._closed:
            return
        self._closed = True
        loop, closing = self._loop, self._closing
        if loop is not None and closing is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended on its own
                loop.call_soon_threadsafe(closing.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ThrottlingProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ control

    def set_latency(self, ms: float) -> None:
        """Delay every forwarded chunk, both directions, by ``ms`` milliseconds."""
        if ms < 0:
            raise ValueError(f"latency must be >= 0 ms, got {ms}")
        seconds = ms / 1000.0

        def apply() -> None:
            self._latency_s = seconds

        self._control(apply)

    def set_rate(self, bytes_per_s: float | None) -> None:
        """Cap each direction at ``bytes_per_s`` (all connections together); None: no cap."""
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"rate must be > 0 bytes/s or None, got {bytes_per_s}")

        def apply() -> None:
            for bucket in self._buckets.values():
                bucket.rate = bytes_per_s

        self._control(apply)

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open and bytes are held."""

        def apply() -> None:
            if self._stalled:
                return
            self._stalled = True
            self._stalled_since = time.monotonic()
            self._stats.stalls += 1
            if self._flowing is not None:
                self._flowing.clear()

        self._control(apply)

    def resume(self) -> None:
        """Forward again: held bytes go first, in order."""

        def apply() -> None:
            if not self._stalled:
                return
            self._stalled = False
            self._stats.stalled_s += time.monotonic() - self._stalled_since
            if self._flowing is not None:
                self._flowing.set()

        self._control(apply)

    @property
    def stalled(self) -> bool:
        return self._stalled

    def stats(self) -> ProxyStats:
        snapshot: list[ProxyStats] = []

        def apply() -> None:
            s = self._stats
            snapshot.append(
                ProxyStats(
                    s.connections,
                    s.open_connections,
                    s.upstream_failures,
                    dict(s.bytes),
                    s.stalls,
                    s.stalled_s,
                )
            )

        self._control(apply)
        return snapshot[0]

    def _control(self, apply: Callable[[], None]) -> None:
        """Run ``apply`` on the proxy's loop (or here, before start) and wait for it."""
        loop = self._loop
        on_loop = threading.current_thread() is self._thread
        if loop is None or on_loop or self._closed or not loop.is_running():
            apply()
            return

        async def run() -> None:
            apply()

        asyncio.run_coroutine_threadsafe(run(), loop).result(CONTROL_TIMEOUT_S)

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main(loop))
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._failure = exc
        finally:
            self._ready.set()
            loop.close()

    async def _main(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flowing = asyncio.Event()
        if not self._stalled:
            self._flowing.set()
        self._closing = asyncio.Event()
        server = await asyncio.start_server(self._serve, sock=self._sock)
        self._loop = loop
        self._ready.set()
        try:
            await self._closing.wait()
        finally:
            server.close()
            for task in list(self._links):
                task.cancel()
            await asyncio.gather(*self._links, return_exceptions=True)
            await server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # noqa: S101 - a callback of start_server runs in a task
        self._links.add(task)
        self._stats.connections += 1
        self._stats.open_connections += 1
        up_w: asyncio.StreamWriter | None = None
        try:
            try:
                up_r, up_w = await asyncio.open_connection(*self.upstream)
            except OSError:
                self._stats.upstream_failures += 1
                return
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(client_r, up_w, Direction.UP))
                group.create_task(self._pump(up_r, client_w, Direction.DOWN))
        except* OSError:
            pass  # one side reset: the other is dropped too
        finally:
            for writer in (client_w, up_w):
                if writer is not None:
                    writer.close()
            self._stats.open_connections -= 1
            self._links.discard(task)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Direction
    ) -> None:
        """Forward one direction until EOF, honouring latency, rate and stalls."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

        async def read() -> None:
            try:
                while chunk := await reader.read(READ_BYTES):
                    await queue.put((loop.time(), chunk))
            except (ConnectionError, OSError):
                pass  # a reset reads as the end of the stream
            await queue.put((loop.time(), _EOF))

        reading = asyncio.create_task(read())
        try:
            while True:
                arrived, chunk = await queue.get()
                await self._hold(arrived)
                if chunk == _EOF:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                await self._write(writer, chunk, direction)
        finally:
            error = await cancel_and_wait(reading)  # a cancellation of the pump propagates
            if error is not None:
                raise error

    async def _hold(self, arrived: float) -> None:
        """Wait until the chunk's latency has passed and the link is not stalled."""
        assert self._flowing is not None  # noqa: S101 - set in _main
        loop = asyncio.get_running_loop()
        while True:
            await self._flowing.wait()
            wait = arrived + self._latency_s - loop.time()
            if wait <= 0:
                return
            await asyncio.sleep(wait)

    async def _write(
        self, writer: asyncio.StreamWriter, chunk: bytes, direction: Direction
    ) -> None:
        assert self._flowing is not None  # noqa: S101 - set in _main
        loop = asyncio.get_running_loop()
        bucket = self._buckets[direction]
        step = SLICE_BYTES if bucket.rate is not None else len(chunk)
        for start in range(0, len(chunk), step):
            piece = chunk[start : start + step]
            delay = bucket.delay(len(piece), loop.time())
            if delay > 0:
                await asyncio.sleep(delay)
            await self._flowing.wait()  # a stall that began while this slice was on the wire
            writer.write(piece)
            await writer.drain()
            self._stats.bytes[direction.value] += len(piece)
