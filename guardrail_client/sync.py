"""``SyncGuardrailPublisher``: the publisher for threaded services, on a loop thread of its own.

Events are validated and built on the caller's thread (a contract violation
raises there); the finished record goes into an outbox (a deque), and the loop
is woken (``call_soon_threadsafe``, once per batch) to move it to the
publisher's queue, so a call never waits for Kafka, nor for a lock.

``stop()`` marks the publisher stopping, then moves what the outbox holds on
the loop before flushing. A call that finds it stopping after its append takes
its record back and raises ``ClientNotStartedError``; if the move took it
first, the call succeeds and the record is delivered or counted. Either way a
record is accepted exactly when the call returns. A call once the loop thread
has ended (the process forked, or the loop was stopped) raises too.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

from guardrail_client.arguments import checked_timeout
from guardrail_client.events import HitLike, OutgoingRecord, SidecarLimits
from guardrail_client.exceptions import ClientAlreadyStartedError, ClientNotStartedError
from guardrail_client.loop_thread import LoopThread
from guardrail_client.publisher import GuardrailPublisher, PublisherStats
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)

log = logging.getLogger("guardrail_client")

AT_EXIT_FLUSH_S = 5.0  # how long a publisher still running at exit flushes
State = Literal["stopped", "starting", "running", "stopping"]


class SyncGuardrailPublisher:
    """``GuardrailPublisher`` with blocking-free sync calls (``with SyncGuardrailPublisher(...)``).

    Takes the same arguments as ``GuardrailPublisher``; ``start()`` starts a
    daemon thread that runs the publisher's event loop. Once ``stop()`` returns,
    every event a call accepted is in ``stats.delivered``, ``failed`` or
    ``dropped``; calls from then on (or from the moment ``stop()`` began, on
    any thread) raise ``ClientNotStartedError``. A second ``start()`` raises
    ``ClientAlreadyStartedError``.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        generator_model: str,
        retrieval_topic: str = "rag.retrieval",
        generation_topic: str = "rag.generation",
        tenant_header: str | None = "x-tenant",
        linger_ms: int = 5,
        max_queued_events: int = 10_000,
        max_open_requests: int = 100_000,
        limits: SidecarLimits | None = None,
        **producer_options: Any,
    ) -> None:
        self._publisher = GuardrailPublisher(
            bootstrap_servers,
            generator_model=generator_model,
            retrieval_topic=retrieval_topic,
            generation_topic=generation_topic,
            tenant_header=tenant_header,
            linger_ms=linger_ms,
            max_queued_events=max_queued_events,
            max_open_requests=max_open_requests,
            limits=limits,
            **producer_options,
        )
        self._runner = LoopThread("guardrail-publisher-loop")
        self._state: State = "stopped"
        self._lock = threading.Lock()  # start() and stop() change the state under it
        self._outbox: deque[OutgoingRecord[Any]] = deque()  # accepted, not yet on the loop
        self._wake_pending = False  # a _move_outbox is scheduled on the loop

    @property
    def stats(self) -> PublisherStats:
        return self._publisher.stats

    def was_dropped(self, request_id: str) -> bool:
        """As :meth:`GuardrailPublisher.was_dropped` (an event of it was dropped: its
        verdict will not come)."""
        return self._publisher.was_dropped(request_id)

    def start(self, timeout_s: float = 30.0) -> None:
        checked_timeout("timeout_s", timeout_s, allow_zero=False)
        if self._state == "running" and self._runner.forked:
            self.stop()  # started before a fork: this process's own publisher from here on
        with self._lock:
            if self._state != "stopped":
                raise ClientAlreadyStartedError(
                    f"SyncGuardrailPublisher.start() called while it is {self._state}; "
                    "call stop() first"
                )
            self._state = "starting"
            self._wake_pending = False
            self._runner.start()
        try:
            self._runner.call(self._publisher.start(), timeout_s)
        except BaseException:
            self._close_loop()
            raise
        with self._lock:
            self._state = "running"
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """The process exits without ``stop()`` (a worker recycled, ``sys.exit``): what the
        calls accepted is flushed for up to ``AT_EXIT_FLUSH_S`` and counted, not lost
        silently with the daemon loop thread (audit: 200 accepted events, none sent)."""
        if self._state != "running" or self._runner.forked:
            return
        log.warning(
            "SyncGuardrailPublisher was not stopped before the process exits: flushing what "
            "it accepted for up to %.0f s (call stop() on shutdown)",
            AT_EXIT_FLUSH_S,
        )
        self.stop(flush_timeout_s=AT_EXIT_FLUSH_S)
        stats = self.stats
        log.warning(
            "SyncGuardrailPublisher at exit: %d events delivered, %d failed, %d dropped",
            stats.delivered,
            stats.failed,
            stats.dropped,
        )

    def stop(self, flush_timeout_s: float = 10.0) -> None:
        """Deliver what was accepted (up to ``flush_timeout_s``), then close the producer.

        When the loop thread has ended in this process, the publisher is stopped on the
        caller's thread instead; in a forked child (which has no loop thread and shares the
        parent's sockets) what it held is counted as dropped and nothing is closed.
        """
        checked_timeout("flush_timeout_s", flush_timeout_s)
        with self._lock:
            if self._state != "running":
                return  # not started, or another stop() is under way
            atexit.unregister(self._at_exit)
            self._state = "stopping"  # the outbox is final: no hand-over from now on
            loop, ended = self._runner.loop, self._runner.ended()
        assert loop is not None  # noqa: S101 - running
        try:
            if ended is None:
                self._runner.call(self._stop_on_loop(flush_timeout_s), flush_timeout_s + 10.0)
            elif self._runner.forked:  # the child must not touch the loop or the sockets
                self._publisher.stats.dropped += len(self._outbox)
                self._outbox.clear()
                self._publisher._abandon(ended)
            else:  # stopped in this process: nothing else runs it, so run it here once more
                loop.run_until_complete(self._stop_on_loop(flush_timeout_s))
        finally:
            self._close_loop()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Block until every queued event is delivered; ``TimeoutError`` after ``timeout_s``."""
        checked_timeout("timeout_s", timeout_s)
        with self._lock:
            if self._state != "running":
                raise ClientNotStartedError(
                    f"SyncGuardrailPublisher.flush() while it is {self._state}"
                )
            if ended := self._runner.ended():
                raise ClientNotStartedError(f"SyncGuardrailPublisher cannot flush: {ended}")
        self._runner.call(self._flush_on_loop(timeout_s), timeout_s + 1.0)

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

    def retrieval(
        self,
        request_id: str,
        query: str,
        hits: Sequence[HitLike],
        *,
        tenant: str,
        collection: str,
        retriever: str = "default",
        k: int | None = None,
        created_at: datetime | None = None,
    ) -> RetrievalEvent:
        record = self._publisher.builder.retrieval(
            request_id,
            query,
            hits,
            tenant=tenant,
            collection=collection,
            retriever=retriever,
            k=k,
            created_at=created_at,
        )
        self._hand_over(record)
        return record.event

    def delta(self, request_id: str, text: str) -> GenerationDelta:
        record = self._publisher.builder.delta(request_id, text)
        self._hand_over(record)
        return record.event

    def final(
        self,
        request_id: str,
        answer: str,
        *,
        attention: AttentionSummary | Any | None = None,
        logprob: float | None = None,
        generator_model: str | None = None,
    ) -> GenerationFinal:
        record = self._publisher.builder.final(
            request_id,
            answer,
            attention=attention,
            logprob=logprob,
            generator_model=generator_model,
        )
        self._hand_over(record)
        return record.event

    def _hand_over(self, record: OutgoingRecord[Any]) -> None:
        """Accept the record (return) or refuse it (raise); lock-free, see the module doc."""
        self._check_accepting()
        self._outbox.append(record)
        if self._state != "running":  # stop() began: did its last move take the record?
            try:
                self._outbox.remove(record)
            except ValueError:
                return  # it did: accepted, and delivered or counted by stop()
            raise ClientNotStartedError(  # it did not: taken back, refused
                "SyncGuardrailPublisher.stop() began during the call; the event was not accepted"
            )
        if not self._wake_pending:  # a wake per batch; set before the move takes the batch
            self._wake_pending = True
            loop = self._runner.loop
            if loop is not None:
                # RuntimeError: a stop() closed the loop since, after it moved the outbox
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._move_outbox)

    def _check_accepting(self) -> None:
        if self._state != "running":
            raise ClientNotStartedError(
                f"SyncGuardrailPublisher used while it is {self._state} "
                "(before start() or after stop() began); the event was not accepted"
            )
        if ended := self._runner.ended():
            raise ClientNotStartedError(
                f"SyncGuardrailPublisher refuses the event: {ended}, so it would never "
                "be sent; stop() it, then start() it again"
            )

    def _move_outbox(self) -> None:
        """On the loop: what the outbox holds goes to the publisher's queue (or is counted)."""
        self._wake_pending = False  # first: a record appended from now on wakes the loop again
        while True:
            try:
                record = self._outbox.popleft()
            except IndexError:  # empty (a caller may have taken its record back)
                return
            try:
                self._publisher.enqueue(record)
            except ClientNotStartedError as exc:  # accepted earlier: counted, never lost
                self._publisher.stats.dropped += 1
                log.warning("an accepted event was dropped: %s", exc)

    async def _stop_on_loop(self, flush_timeout_s: float) -> None:
        self._move_outbox()  # everything accepted before stop() began
        await self._publisher.stop(flush_timeout_s)

    async def _flush_on_loop(self, timeout_s: float) -> None:
        self._move_outbox()
        await self._publisher.flush(timeout_s)

    def _close_loop(self) -> None:
        with self._lock:
            runner, self._runner = self._runner, LoopThread(self._runner.name)
            self._state = "stopped"
        runner.close()
