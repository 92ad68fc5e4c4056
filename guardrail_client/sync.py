"""``SyncGuardrailPublisher``: the publisher for threaded services, on a loop thread of its own.

Events are validated and built on the caller's thread (a contract violation
raises there); the finished record crosses to the publisher's loop with
``call_soon_threadsafe``, so a call never waits for Kafka.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from guardrail_client.events import HitLike, OutgoingRecord
from guardrail_client.exceptions import ClientNotStartedError
from guardrail_client.publisher import GuardrailPublisher, PublisherStats
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)

T = TypeVar("T")


class SyncGuardrailPublisher:
    """``GuardrailPublisher`` with blocking-free sync calls (``with SyncGuardrailPublisher(...)``).

    Takes the same arguments as ``GuardrailPublisher``; ``start()`` starts a
    daemon thread that runs the publisher's event loop.
    """

    def __init__(self, bootstrap_servers: str, **options: Any) -> None:
        self._publisher = GuardrailPublisher(bootstrap_servers, **options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def stats(self) -> PublisherStats:
        return self._publisher.stats

    def start(self, timeout_s: float = 30.0) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=loop.run_forever, name="guardrail-publisher-loop", daemon=True
        )
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._call(self._publisher.start(), timeout_s)
        except BaseException:
            self._close_loop()
            raise

    def stop(self, flush_timeout_s: float = 10.0) -> None:
        if self._loop is None:
            return
        try:
            self._call(self._publisher.stop(flush_timeout_s), flush_timeout_s + 10.0)
        finally:
            self._close_loop()

    def flush(self, timeout_s: float = 10.0) -> None:
        """Block until every queued event is delivered; ``TimeoutError`` after ``timeout_s``."""
        self._call(self._publisher.flush(timeout_s), timeout_s + 1.0)

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
        if self._loop is None:
            raise ClientNotStartedError(
                "SyncGuardrailPublisher used before start() or after stop()"
            )
        self._loop.call_soon_threadsafe(self._publisher.enqueue, record)

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        assert self._loop is not None  # noqa: S101 - started
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _close_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10.0)
        loop.close()
