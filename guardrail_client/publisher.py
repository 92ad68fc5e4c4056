"""``GuardrailPublisher``: the LLM service's events onto Kafka without blocking its event loop.

A call (``retrieval``, ``delta``, ``final``) validates and builds the event on
the spot (a contract violation raises ``InvalidEventError`` there and nothing
is sent), then puts the record on a bounded in-memory queue and returns. One
background task hands the queue to aiokafka's producer, which batches per
partition (``linger_ms``). When Kafka is away, or a burst outruns it, the queue
fills; events are then dropped and counted (``stats.dropped``) rather than
stalling requests, by whole requests: a request one of whose events was dropped
has its later events dropped too (they could no longer be decided, and would
only take room from requests that can), a new request is not admitted while
the queue is over 70 % full (the rest is kept for the requests under way), and
from 80 % on, each further 5 % it fills sheds the newer half of the requests
under way, so that the older ones can finish.
:meth:`GuardrailPublisher.was_dropped` says which requests were dropped: their
verdicts will not come, so the caller can decide without waiting; otherwise
the ``VerdictClient``'s ``on_timeout`` decides.

Every event a call accepted ends up in exactly one of ``stats.delivered``,
``stats.failed`` or ``stats.dropped`` once ``stop()`` returns. A call that
cannot be sent at all raises ``ClientNotStartedError`` instead of being
accepted: before ``start()``, once ``stop()`` began, and when the event loop
the publisher was started on has ended (its send task is gone with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from guardrail_client.aio import cancel_and_wait
from guardrail_client.arguments import checked_options, checked_timeout
from guardrail_client.authorised import WRITE, topic_operations
from guardrail_client.events import EventBuilder, HitLike, OutgoingRecord, SidecarLimits
from guardrail_client.exceptions import (
    ClientAlreadyStartedError,
    ClientBrokerError,
    ClientError,
    ClientNotStartedError,
    InvalidArgumentError,
    PartitionerWarning,
    require_authorised,
)
from guardrail_client.keys import is_murmur2_partitioner
from sidecar.contracts.events import (
    AttentionSummary,
    GenerationDelta,
    GenerationFinal,
    RetrievalEvent,
)

log = logging.getLogger("guardrail_client")


@dataclass(slots=True)
class PublisherStats:
    """What happened to the events handed to the publisher."""

    queued: int = 0
    delivered: int = 0
    failed: int = 0  # the broker refused, the delivery timed out, or was unconfirmed at stop()
    dropped: int = 0  # the queue was full (Kafka away or too slow), or still queued at stop()


def check_partitioner(producer_options: dict[str, Any]) -> None:
    """Warn when a partitioner other than murmur2 (Kafka's default) is configured."""
    partitioner = producer_options.get("partitioner")
    if partitioner is not None and not is_murmur2_partitioner(partitioner):
        warnings.warn(
            f"partitioner {partitioner!r} is not Kafka's murmur2 default: a request's retrieval "
            "and generation events may land on different partitions, and the sidecar joins "
            "them within one: it sends each record off its murmur2 partition on to it (a "
            "produce and a fetch later; GUARDRAIL_JOIN__REROUTE), or, with rerouting off, "
            "decides such a request incomplete",
            PartitionerWarning,
            stacklevel=3,
        )


class GuardrailPublisher:
    """Async publisher of the LLM service's events (``async with GuardrailPublisher(...)``).

    ``producer_options`` go to ``AIOKafkaProducer`` (security settings, ``acks``,
    ``compression_type``); records are keyed by request id and partitioned by
    murmur2, as the sidecar's co-partitioned join needs. Each event carries the
    caller's current OpenTelemetry context as a ``traceparent`` header.

    The producer is idempotent (``acks="all"``, ``enable_idempotence=True``; Kafka's Java
    producer does the same by default since 3.0): a send retried after a broker restart
    or a leadership move is written once, in order. Without it, a rolling restart of a
    three-node cluster wrote one event of 1,906 twice.
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
        if max_queued_events < 1:
            raise InvalidArgumentError(f"max_queued_events must be >= 1, got {max_queued_events}")
        checked_options(GuardrailPublisher, AIOKafkaProducer, producer_options)
        check_partitioner(producer_options)
        self.builder = EventBuilder(
            retrieval_topic=retrieval_topic,
            generation_topic=generation_topic,
            generator_model=generator_model,
            tenant_header=tenant_header,
            max_open_requests=max_open_requests,
            limits=limits,
        )
        self.stats = PublisherStats()
        self._producer_args: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "linger_ms": linger_ms,
            "acks": "all",
            "enable_idempotence": True,
            **producer_options,
        }
        self._max_queued = max_queued_events
        # a new request is admitted while the queue holds less than this: the rest is the
        # room of the requests under way (their later events), so drops take whole requests
        self._admit_below = max(1, max_queued_events * 7 // 10)
        # from 80 % full, each further 5 % the queue climbs sheds the newer half of the
        # requests under way (_shed): their demand halves before the queue is full
        self._shed_from = max(1, max_queued_events * 8 // 10)
        self._shed_step = max(1, max_queued_events // 20)
        self._shed_level = 0
        self._max_ids = max_open_requests
        self._admitted: OrderedDict[str, None] = OrderedDict()  # ids with an event queued
        self._dropped_ids: OrderedDict[str, None] = OrderedDict()  # ids with one dropped
        self._producer: AIOKafkaProducer | None = None
        self._queue: asyncio.Queue[OutgoingRecord[Any]] | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop start() ran on
        self._started = False  # from the start of start() to the end of stop()
        self._accepting = False  # from the end of start() to the start of stop()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the producer and the send task on the running loop.

        ``ClientAlreadyStartedError`` when it is started already (or starting): a second
        producer is never created; ``stop()`` first.
        """
        if self._started:
            raise ClientAlreadyStartedError(
                "GuardrailPublisher.start() called again while it is started; call stop() first"
            )
        self._started = True
        producer = AIOKafkaProducer(**self._producer_args)
        servers = self._producer_args["bootstrap_servers"]
        try:
            await producer.start()
            await self._require_topics(producer)
        except KafkaError as exc:
            self._started = False
            await producer.stop()
            raise ClientBrokerError(f"cannot reach Kafka at {servers}: {exc}") from exc
        except BaseException:  # a bad address (ValueError), a missing topic, a cancellation
            self._started = False
            with contextlib.suppress(Exception):
                await producer.stop()  # it was left open ("Unclosed AIOKafkaProducer")
            raise
        self._producer = producer
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue(self._max_queued)
        self._drain_task = asyncio.create_task(self._drain(), name="guardrail-publisher")
        self._accepting = True

    async def _require_topics(self, producer: AIOKafkaProducer) -> None:
        """The topics it writes exist: else every event would wait for them and be dropped
        at ``stop()``, while aiokafka logged ``not found in cluster metadata`` 10 times a
        second and nothing said why (audit). And the cluster's ACLs let it write them: else
        every event failed, one warning each."""
        topics = (self.builder.retrieval_topic, self.builder.generation_topic)
        metadata = await producer.client.fetch_all_metadata()
        operations = await topic_operations(producer.client, topics)
        require_authorised(
            dict.fromkeys(topics, WRITE),
            metadata.topics(),
            operations,
            self._producer_args,
        )

    async def stop(self, flush_timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to ``flush_timeout_s``), then close the producer.

        Calls made once it began raise ``ClientNotStartedError``; what is still queued at
        the deadline is counted as dropped, what is sent but unconfirmed as failed. When the
        loop the publisher started on has ended, nothing can be sent or closed there: what
        it held is counted the same way at once (and the producer is left to that loop).
        """
        checked_timeout("flush_timeout_s", flush_timeout_s)
        if self._producer is None or not self._accepting:
            return  # not started, or another stop() is under way
        self._accepting = False
        if _running_loop() is not self._loop:
            if self._loop is not None and self._loop.is_running():
                self._accepting = True
                raise ClientError(
                    "GuardrailPublisher.stop() must be awaited on the event loop start() ran "
                    "on (it is still running, in another thread)"
                )
            self._abandon(f"its event loop has ended ({self._loop_ended()})")
            return
        producer, drain = self._producer, self._drain_task
        dropped_before = self.stats.dropped
        try:
            # ClientNotStartedError: the send task ended, so the queue cannot drain
            with contextlib.suppress(TimeoutError, ClientNotStartedError):
                await self.flush(flush_timeout_s)
            dropped_before = self.stats.dropped  # what the flush's calls dropped is not ours
            if drain is not None and not drain.done():
                await cancel_and_wait(drain)  # what it held is counted below
            await producer.stop()
            await asyncio.sleep(0)  # run the callbacks of the deliveries stop() confirmed
        finally:
            if drain is not None:
                drain.cancel()  # stop() itself was cancelled: the task must not outlive it
            self._count_undelivered(
                f"not delivered within flush_timeout_s={flush_timeout_s:g}",
                cancelled=self.stats.dropped - dropped_before,
            )
            self._forget_producer()

    def _abandon(self, why: str) -> None:
        """Count what the publisher holds, without its loop (that one has ended), and forget
        it. Called on a loop that is not the publisher's, or with no loop at all."""
        log.warning("stop(): %s; the producer cannot be closed from here", why)
        self._accepting = False
        self._count_undelivered(why)
        self._forget_producer()

    def _count_undelivered(self, why: str, cancelled: int = 0) -> None:
        """Accepted, never delivered: counted (``dropped`` if queued, ``failed`` if sent but
        unconfirmed), never silently gone. ``cancelled``: dropped already, the one the send
        task held when it was cancelled (the warning counts it with the queued ones)."""
        queued = self._queue.qsize() if self._queue is not None else 0
        self.stats.dropped += queued
        left = queued + cancelled
        unconfirmed = 0
        for future in list(self._pending):
            future.remove_done_callback(self._delivered)
            if future.done():
                self._delivered(future)
            else:
                self._pending.discard(future)
                unconfirmed += 1
        self.stats.failed += unconfirmed
        if left or unconfirmed:
            log.warning(
                "stop(): %d queued events counted as dropped and %d sent ones as failed: %s",
                left,
                unconfirmed,
                why,
            )

    def _forget_producer(self) -> None:
        self._producer = self._queue = self._drain_task = self._loop = None
        self._started = self._accepting = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ events

    async def retrieval(
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
        """Queue the retrieval event (hits best first: ``RetrievalHit`` or mappings)."""
        record = self.builder.retrieval(
            request_id,
            query,
            hits,
            tenant=tenant,
            collection=collection,
            retriever=retriever,
            k=k,
            created_at=created_at,
        )
        self.enqueue(record)
        return record.event

    async def delta(self, request_id: str, text: str) -> GenerationDelta:
        """Queue the next streamed piece of the answer."""
        record = self.builder.delta(request_id, text)
        self.enqueue(record)
        return record.event

    async def final(
        self,
        request_id: str,
        answer: str,
        *,
        attention: AttentionSummary | Any | None = None,
        logprob: float | None = None,
        generator_model: str | None = None,
    ) -> GenerationFinal:
        """Queue the final event: the whole answer, its attention summary and mean logprob."""
        record = self.builder.final(
            request_id,
            answer,
            attention=attention,
            logprob=logprob,
            generator_model=generator_model,
        )
        self.enqueue(record)
        return record.event

    def enqueue(self, record: OutgoingRecord[Any]) -> None:
        """Queue a built record; never waits. Called on the publisher's own loop only.

        ``ClientNotStartedError`` (the record is not accepted) before ``start()``, once
        ``stop()`` began, or when the publisher's event loop has ended.
        """
        queue = self._running_queue()
        request_id = record.event.request_id
        self._pressure(queue.qsize())
        if request_id in self._dropped_ids:
            self._drop(request_id)  # undecidable already: it takes no room from others
            return
        new = request_id not in self._admitted
        if new and queue.qsize() >= self._admit_below:
            self._drop(request_id)
            return
        try:
            queue.put_nowait(record)
        except asyncio.QueueFull:
            self._drop(request_id)
            return
        if record.event.event_type == "generation.final":
            self._admitted.pop(request_id, None)  # its events are all queued: not in flight
        elif new:
            _remember(self._admitted, request_id, self._max_ids)
        self.stats.queued += 1

    def _pressure(self, queued: int) -> None:
        """Shed once for each 5 % step the queue climbs past 80 % full; a step it falls
        back below may shed again later."""
        level = (
            (queued - self._shed_from) // self._shed_step + 1 if queued >= self._shed_from else 0
        )
        if level > self._shed_level:
            self._shed()
        self._shed_level = level

    def _shed(self) -> None:
        """The queue is filling faster than Kafka takes it: the newer half of the requests
        under way gives up, so that the older half's remaining events find room. Without
        it, every request streaming into a full queue lost its next event at once (1,000
        concurrent streams of 14 events through 10,000 places: all 1,000 dropped)."""
        shed = len(self._admitted) // 2
        for _ in range(shed):
            request_id, _ = self._admitted.popitem(last=True)
            _remember(self._dropped_ids, request_id, self._max_ids)
        if shed:
            log.warning(
                "the queue is filling faster than Kafka takes it (past 80 %% of "
                "max_queued_events=%d): %d newer requests under way gave up so that %d older "
                "ones can finish (was_dropped(request_id) says which)",
                self._max_queued,
                shed,
                len(self._admitted),
            )

    def was_dropped(self, request_id: str) -> bool:
        """Whether an event of ``request_id`` was dropped (the queue was full): its verdict
        will not come (the ``max_open_requests`` latest such requests are remembered)."""
        return request_id in self._dropped_ids

    def _drop(self, request_id: str) -> None:
        self.stats.dropped += 1
        _remember(self._dropped_ids, request_id, self._max_ids)
        self._admitted.pop(request_id, None)
        if self.stats.dropped == 1 or self.stats.dropped % 1000 == 0:
            log.warning(
                "dropped %d events so far, by whole requests: the queue was full "
                "(max_queued_events=%d): Kafka is away, or slower than the service's burst; "
                "those requests' verdicts will not come (was_dropped(request_id) says which)",
                self.stats.dropped,
                self._max_queued,
            )

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued event is delivered (or failed); ``TimeoutError`` after."""
        checked_timeout("timeout_s", timeout_s)
        if self._queue is None or self._producer is None:
            raise ClientNotStartedError("GuardrailPublisher used before start() or after stop()")
        queue, producer = self._queue, self._producer
        if ended := self._loop_ended():
            raise ClientNotStartedError(f"GuardrailPublisher cannot flush: {ended}")
        async with asyncio.timeout(timeout_s):
            await queue.join()
            await producer.flush()
            if self._pending:
                await asyncio.wait(set(self._pending))

    def _running_queue(self) -> asyncio.Queue[OutgoingRecord[Any]]:
        if self._queue is None or not self._accepting:
            raise ClientNotStartedError("GuardrailPublisher used before start() or after stop()")
        if ended := self._loop_ended():
            raise ClientNotStartedError(
                f"GuardrailPublisher refuses the event: {ended}, so it would never be sent; "
                "stop() it, then start() it on the running loop"
            )
        return self._queue

    def _loop_ended(self) -> str | None:
        """Why records queued now could never be sent (None when they can)."""
        if self._loop is None:
            return None
        if self._loop.is_closed():
            return "the event loop it was started on is closed"
        if _running_loop() is not self._loop:
            return "it was started on another event loop (one that has ended, or another thread's)"
        task = self._drain_task
        if task is not None and task.done():
            cause = "cancelled" if task.cancelled() else repr(task.exception())
            return f"its send task ended ({cause})"
        return None

    # ------------------------------------------------------------------ the drain task

    async def _drain(self) -> None:
        assert self._queue is not None and self._producer is not None  # noqa: S101 - started
        queue, producer = self._queue, self._producer
        while True:
            record = await queue.get()
            try:
                future = await producer.send(
                    record.topic, record.value, key=record.key, headers=list(record.headers)
                )
            except KafkaError as exc:
                self._failed(f"could not send a {record.event.event_type} event: {exc}")
            except asyncio.CancelledError:  # stop() while this one waited for the producer
                self.stats.dropped += 1
                raise
            except Exception:  # a bug, not Kafka: counted; the task ends, later calls refuse
                self.stats.failed += 1
                raise
            else:
                self._pending.add(future)
                future.add_done_callback(self._delivered)
            finally:
                queue.task_done()

    def _failed(self, why: str) -> None:
        """Count an event Kafka refused; said for the first and every 1,000th (a topic the
        principal may not write refuses every event: one line each flooded the service's
        log, 300 lines for 300 requests)."""
        self.stats.failed += 1
        if self.stats.failed == 1 or self.stats.failed % 1000 == 0:
            log.warning("%d event(s) not delivered so far; the last: %s", self.stats.failed, why)

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        if future.cancelled():
            self.stats.failed += 1
        elif (exc := future.exception()) is not None:
            self._failed(f"an event was not delivered: {exc}")
        else:
            self.stats.delivered += 1


def _remember(ids: OrderedDict[str, None], request_id: str, most: int) -> None:
    """``request_id`` last in ``ids``, which keeps the ``most`` latest."""
    ids[request_id] = None
    ids.move_to_end(request_id)
    while len(ids) > most:
        ids.popitem(last=False)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # called from no loop (a thread, or the loop has ended)
        return None
