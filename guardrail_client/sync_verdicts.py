"""``SyncVerdictClient``: the verdict client for threaded services, on a loop thread of its own.

A threaded service (Flask, Django, gunicorn's sync workers) publishes with
``SyncGuardrailPublisher`` and waits for the verdict here, on the request's own
thread: ``verdict()`` blocks that thread (never longer than its timeout plus a
margin) while the ``VerdictClient`` underneath runs on a daemon thread, and any
number of threads may wait at once. The same arguments, fallbacks and checks as
``VerdictClient``: a bad request id or timeout raises on the caller's thread;
before ``start()``, after ``stop()``, once the loop thread has ended or in a
forked child (which has no loop thread), ``verdict()`` answers at once with the
``unavailable`` fallback, as ``VerdictClient`` does when its consumer is not
running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from guardrail_client.arguments import checked_request_id, checked_timeout
from guardrail_client.exceptions import ClientAlreadyStartedError, ClientNotStartedError
from guardrail_client.loop_thread import LoopThread
from guardrail_client.verdicts import OnTimeout, VerdictClient, VerdictResult
from guardrail_client.waiters import EXPECTED_MAX_ENTRIES, RECENT_MAX_BYTES
from sidecar.contracts.events import ClaimVerdict

T = TypeVar("T")
log = logging.getLogger("guardrail_client")

# how much longer than its own deadline a blocked caller waits for the loop thread to answer
# (a wedged or overloaded loop then gives the timeout fallback instead of a hung thread)
LOOP_MARGIN_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException


_END: Final = object()  # the claims' async iteration ended


async def _expect(client: VerdictClient, request_id: str) -> None:
    """On the loop of ``client`` (the one the call was handed to, not a later one)."""
    client.expect(request_id)


class SyncVerdictClient:
    """``VerdictClient`` with blocking calls (``with SyncVerdictClient(...) as verdicts``).

    Takes ``VerdictClient``'s arguments. ``start()`` starts a daemon thread that
    runs the client's consumer; ``verdict()`` and ``claims()`` block the calling
    thread only. A second ``start()`` raises ``ClientAlreadyStartedError``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        verdicts_topic: str = "rag.verdicts",
        claims_topic: str | None = "rag.claims",
        on_timeout: OnTimeout = "allow",
        timeout_s: float = 5.0,
        claims_settle_s: float = 0.5,
        recent_max_entries: int = 10_000,
        recent_ttl_s: float = 60.0,
        start_timeout_s: float = 30.0,
        recent_max_bytes: int = RECENT_MAX_BYTES,
        expected_max_entries: int = EXPECTED_MAX_ENTRIES,
        **consumer_options: Any,
    ) -> None:
        self._args: dict[str, Any] = {
            "verdicts_topic": verdicts_topic,
            "claims_topic": claims_topic,
            "on_timeout": on_timeout,
            "timeout_s": timeout_s,
            "claims_settle_s": claims_settle_s,
            "recent_max_entries": recent_max_entries,
            "recent_ttl_s": recent_ttl_s,
            "start_timeout_s": start_timeout_s,
            "recent_max_bytes": recent_max_bytes,
            "expected_max_entries": expected_max_entries,
            **consumer_options,
        }
        self._bootstrap_servers = bootstrap_servers
        self._client = VerdictClient(bootstrap_servers, **self._args)
        self._runner = LoopThread("guardrail-verdicts-loop")
        self._lock = threading.Lock()  # start() and stop() under it
        # hand-overs to the loop and the end of accepting them, atomic with each other: a
        # call never submits to a loop that stop() is about to end (its coroutine would
        # never run, and the caller would wait for the loop margin instead of 'unavailable')
        self._submit = threading.Lock()
        self._accepting = False
        self._started = False

    @property
    def on_timeout(self) -> OnTimeout:
        return self._client.on_timeout

    @property
    def timeout_s(self) -> float:
        return self._client.timeout_s

    @property
    def records_read(self) -> int:
        return self._client.records_read

    @property
    def running(self) -> bool:
        """The consumer runs (on a loop thread of this process)."""
        return self._runner.ended() is None and self._client.running

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the loop thread and the consumer (as ``VerdictClient.start()``: from the
        topics' current ends; ``ClientBrokerError`` when the broker or a topic is missing)."""
        if self._started and self._runner.forked:
            self.stop()  # started before a fork: this process's own client from here on
        with self._lock:
            if self._started:
                raise ClientAlreadyStartedError(
                    "SyncVerdictClient.start() called again while it is started; call stop() first"
                )
            self._started = True
            self._runner.start()
            try:
                self._runner.call(
                    self._client.start(), self._client.start_timeout_s + LOOP_MARGIN_S
                )
            except BaseException:
                self._close()
                raise
            with self._submit:
                self._accepting = True

    def stop(self) -> None:
        """Stop the consumer and the loop thread; threads still waiting get ``unavailable``."""
        with self._lock:
            if not self._started:
                return
            with self._submit:
                self._accepting = False
            try:
                if self._runner.ended() is None:
                    self._runner.call(self._client.stop(), LOOP_MARGIN_S)
            except TimeoutError:  # the loop is blocked: waiters give up at their margin
                log.warning(
                    "SyncVerdictClient.stop(): the consumer did not stop within %.0f s (its "
                    "event loop is blocked); going on without it",
                    LOOP_MARGIN_S,
                )
            finally:
                self._close()

    def _close(self) -> None:
        runner, self._runner = self._runner, LoopThread(self._runner.name)
        self._started = False
        # a fresh client for the next start(): the old one may not have stopped (a blocked
        # loop), or belongs to the parent (a fork)
        self._client = VerdictClient(self._bootstrap_servers, **self._args)
        runner.close(LOOP_MARGIN_S)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ waiting

    def expect(self, request_id: str) -> None:
        """As :meth:`VerdictClient.expect`; returns once the announcement is in place, so a
        request published after it cannot beat it. Nothing to announce while not running
        (its ``verdict()`` is ``unavailable`` then anyway)."""
        checked_request_id(request_id)
        future = self._hand_over(_expect(self._client, request_id))
        if future is None:
            return
        try:
            future.result(LOOP_MARGIN_S)
        except TimeoutError:  # a blocked loop: the wait that follows falls back anyway
            future.cancel()

    def _hand_over(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T] | None:
        """``coro`` submitted to the running loop, or None (closed) when this client does
        not accept calls now: before start(), once stop() began, its loop thread ended or
        the process forked."""
        with self._submit:
            loop = self._runner.loop
            if self._accepting and loop is not None and self._runner.ended() is None:
                return asyncio.run_coroutine_threadsafe(coro, loop)
        coro.close()
        return None

    def verdict(
        self, request_id: str, timeout: float | None = None, *, tenant: str | None = None
    ) -> VerdictResult:
        """As :meth:`VerdictClient.verdict`, blocking this thread for at most ``timeout``
        (``timeout_s`` when None) plus ``LOOP_MARGIN_S`` if the loop thread is too busy to
        answer at the deadline (then the ``timeout`` fallback)."""
        checked_request_id(request_id)
        if timeout is not None:
            checked_timeout("timeout", timeout)
        started = time.monotonic()
        client = self._client
        wait = timeout if timeout is not None else client.timeout_s
        future = self._hand_over(client.verdict(request_id, timeout, tenant=tenant))
        if future is None:
            return client._fallback(request_id, "unavailable", 0.0)
        try:
            return future.result(wait + LOOP_MARGIN_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return client._fallback(request_id, "timeout", time.monotonic() - started)

    def claims(
        self, request_id: str, timeout: float | None = None, *, tenant: str | None = None
    ) -> Generator[ClaimVerdict, None, None]:
        """As :meth:`VerdictClient.claims`: the request's claim verdicts as they come, on
        this thread; closing the iterator early stops the wait on the loop."""
        checked_request_id(request_id)
        if timeout is not None:
            checked_timeout("timeout", timeout)
        return self._claims(request_id, timeout, tenant)

    def _claims(
        self, request_id: str, timeout: float | None, tenant: str | None
    ) -> Generator[ClaimVerdict, None, None]:
        if self._client.claims_topic is None:
            raise ClientNotStartedError(
                "this SyncVerdictClient reads no claims (claims_topic=None)"
            )
        started = time.monotonic()
        client = self._client
        items: queue.SimpleQueue[object] = queue.SimpleQueue()

        async def pump() -> None:
            try:
                async for claim in client.claims(request_id, timeout, tenant=tenant):
                    items.put(claim)
            except BaseException as exc:  # VerdictTimeoutError under "raise", a cancellation
                items.put(_Raised(exc))
                raise
            finally:
                items.put(_END)

        future = self._hand_over(pump())
        if future is None:
            client._fallback(request_id, "unavailable", 0.0)  # raises under "raise"
            return
        deadline = (
            started + (timeout if timeout is not None else self._client.timeout_s) + LOOP_MARGIN_S
        )
        try:
            while True:
                try:
                    item = items.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:  # the loop thread did not end the iteration in time
                    client._fallback(request_id, "timeout", time.monotonic() - started)
                    return
                if item is _END:
                    return
                if isinstance(item, _Raised):
                    if isinstance(item.error, asyncio.CancelledError | GeneratorExit):
                        return
                    raise item.error
                assert isinstance(item, ClaimVerdict)  # noqa: S101 - only these are put
                yield item
        finally:
            future.cancel()  # ended early (break, close): the async iteration stops too
