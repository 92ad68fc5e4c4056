"""The sidecar's Kafka loop: a FastStream app over aiokafka, owning its commits.

One subscriber reads both input topics in one consumer group with
``AckPolicy.MANUAL``: FastStream never commits on its own. Every consumed
offset is tracked as pending; the processor's outputs are published (and
confirmed by the broker) before the inputs they finish are marked done, and a
periodic task commits the per-partition low-water mark. A crash therefore
re-reads whatever was not published yet: a verdict comes once or twice, never
zero times, and a replayed verdict carries the same idempotency key.

FastStream's own parsing is bypassed where it could fail before our handler
runs (header decoding, JSON body decoding): a message that never reached the
handler would never be tracked, and a later commit could pass over it.

Outputs go to the broker's aiokafka producer directly, with header values as
bytes (FastStream's ``publish`` takes text only). Publish errors are decided by
kind (``classify``): retriable ones are retried with capped, jittered backoff
while ``LoopState.publishing`` turns false after ``publish_stall_s``; a record too
large for its topic goes to the DLQ cut down to fit (``fit_dead_letter``), never
retried as it is; an authorisation or configuration error makes the loop not
live (``LoopState.fatal``), with one log line naming the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    IllegalStateError,
    InvalidTopicError,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownTopicOrPartitionError,
)
from aiokafka.errors import RecordTooLargeError as KafkaRecordTooLargeError
from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.exceptions import (
    BrokerAccessError,
    BrokerError,
    GuardrailError,
    InputError,
    RecordTooLargeError,
)
from sidecar.kafka.assignor import co_partition_assignor, split_pairs
from sidecar.kafka.cut import KeyIndex
from sidecar.kafka.security import aiokafka_client_args, faststream_security
from sidecar.kafka.topics import format_counts, partition_count_problem
from sidecar.pipeline.deadletters import fit_dead_letter, record_size, undeliverable_output
from sidecar.pipeline.flow import InputAligner
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.offsets import OffsetTracker
from sidecar.pipeline.outputs import Destination, Output, Step
from sidecar.pipeline.processor import Processor
from sidecar.telemetry import Telemetry

log = logging.getLogger("sidecar.kafka")

_T = TypeVar("_T")

MAX_PUBLISH_BACKOFF_S = 5.0
FIRST_PUBLISH_BACKOFF_S = 0.1
PUBLISH_STALL_S = 10.0  # publishing failing this long: not ready (the loop keeps retrying)
UNKNOWN_TOPIC_FATAL_S = 30.0  # a destination topic missing this long: not live either
REQUEST_SIZE_MARGIN_BYTES = 65_536  # the producer's max_request_size over max_message_bytes
MIN_DLQ_BYTES = 1_024  # a DLQ topic that refuses a dead letter this small is misconfigured
PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0


def make_broker(settings: Settings) -> KafkaBroker:
    """A FastStream Kafka broker with an idempotent producer and explicit topics."""
    kafka = settings.kafka
    return KafkaBroker(
        kafka.bootstrap_servers,
        client_id=kafka.client_id,
        request_timeout_ms=kafka.request_timeout_ms,
        security=faststream_security(kafka),
        allow_auto_create_topics=False,
        acks="all",
        enable_idempotence=True,
        max_request_size=settings.topics.max_message_bytes + REQUEST_SIZE_MARGIN_BYTES,
        logger=log,
        log_level=logging.DEBUG,
        graceful_timeout=settings.shutdown_grace_ms / 1000.0,
    )


async def _tolerant_parser(record: Any, original: Callable[[Any], Awaitable[Any]]) -> Any:
    """FastStream's parser, but header values that are not UTF-8 do not kill the message.

    ``record`` is one consumer record or, in batch mode, a tuple of them. FastStream
    decodes every header value as UTF-8; when one is not, it parses copies whose
    header values are made text, and the handler still gets the consumer's own
    records (``raw_message``), header bytes untouched: nothing here mutates them.
    """
    try:
        return await original(record)
    except UnicodeDecodeError:
        pass
    if isinstance(record, tuple | list):
        message = await original(tuple(_text_headers(r) for r in record))
    else:
        message = await original(_text_headers(record))
    message.raw_message = record
    return message


def _text_headers(record: Any) -> Any:
    """A shallow copy of ``record`` whose header values decode as UTF-8 (for FastStream only)."""
    clone = copy.copy(record)
    clone.headers = [
        (name, value.decode("utf-8", errors="replace").encode("utf-8"))
        for name, value in record.headers or ()
    ]
    return clone


async def _raw_decoder(message: Any) -> Any:
    """Hand the handler the raw bytes: validation is ours, with DLQ reasons."""
    return message.body


async def _cluster_metadata(consumer: Any) -> Any:
    """A fresh cluster metadata snapshot (None: a consumer without a client, in memory).

    ``AIOKafkaConsumer.topics()`` fetches exactly this and keeps only the names;
    the partition counts are what the probe needs.
    """
    client = getattr(consumer, "_client", None)
    if client is None or not hasattr(client, "fetch_all_metadata"):
        await consumer.topics()
        return None
    return await client.fetch_all_metadata()


async def _confirmed(future: Any) -> Any:
    """A producer future (real broker) or an immediate result (in-memory broker)."""
    if asyncio.isfuture(future) or asyncio.iscoroutine(future):
        return await future
    return future


_TOO_LARGE = (MessageSizeTooLargeError, KafkaRecordTooLargeError)
_NO_ACCESS = (
    TopicAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    SaslAuthenticationFailed,
    AuthenticationFailedError,
    InvalidTopicError,
    OutOfOrderSequenceNumber,  # the idempotent producer is broken for good
    ProducerFenced,
)


def classify(exc: BaseException, topic: str) -> BrokerError:
    """A failed publish to ``topic`` as the kind the loop branches on (flags, not text).

    ``RecordTooLargeError`` (``dead_letter``): this record alone can never go out as
    it is. ``BrokerAccessError`` (``fatal``): authorisation or configuration, or a
    producer that cannot recover. Anything else is retriable (``BrokerError``):
    aiokafka's own ``retriable`` errors, timeouts, a broker that is away.
    """
    if isinstance(exc, BrokerError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, _TOO_LARGE):
        return RecordTooLargeError(topic, f"{name}: {exc}")
    if isinstance(exc, _NO_ACCESS):
        return BrokerAccessError(topic, f"{name}: {exc}")
    return BrokerError(f"publish to {topic} failed: {name}: {exc}")


def backoff_delay(attempt: int, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): capped exponential, jittered in [1/2, 1]."""
    ceiling = min(MAX_PUBLISH_BACKOFF_S, FIRST_PUBLISH_BACKOFF_S * 2.0 ** min(attempt, 32))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


@dataclass(slots=True)
class LoopState:
    """What the health endpoint and the tests read."""

    started: bool = False
    broker_ok: bool = False  # the last metadata probe (every ~2 s) reached the cluster
    assigned: set[tuple[str, int]] = field(default_factory=set)
    # what the last assignment tears apart (a partition number held on one input topic
    # but not on another), one line each; non-empty: not ready
    split: list[str] = field(default_factory=list)
    # the input topics exist with equal partition counts, as at start (the probe checks)
    topics_ok: bool = True
    input_partitions: dict[str, int] = field(default_factory=dict)  # as the last probe saw them
    commits: int = 0
    last_committed: dict[tuple[str, int], int] = field(default_factory=dict)
    publish_retries: int = 0
    truncated_dead_letters: int = 0
    undeliverable_outputs: int = 0  # outputs too large for their topic, dead-lettered instead
    publish_failing_since: float | None = None  # monotonic s: the output being retried first failed
    publish_stall_s: float = PUBLISH_STALL_S
    fatal: str | None = None  # why no retry can help (authorisation, configuration)

    @property
    def publishing(self) -> bool:
        """For readiness: false while publishing has failed for ``publish_stall_s`` or fatally."""
        if self.fatal is not None:
            return False
        since = self.publish_failing_since
        return since is None or time.monotonic() - since < self.publish_stall_s

    @property
    def live(self) -> bool:
        """For liveness: false after a fatal publish error (a restart with the cause logged)."""
        return self.fatal is None


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: SidecarService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._service.on_revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._service.on_assigned({(tp.topic, tp.partition) for tp in assigned})


class SidecarService:
    """Wires a ``Processor`` to Kafka. Thin: decisions live in the processor."""

    def __init__(
        self,
        settings: Settings,
        processor: Processor,
        broker: KafkaBroker | None = None,
        telemetry: Telemetry | None = None,
        assignor: type[AbstractPartitionAssignor] | None = None,
    ) -> None:
        """``assignor``: the group's partition assignment strategy (default: a fresh
        ``CoPartitionAssignor``; tests pass aiokafka's round-robin as the control)."""
        self.settings = settings
        self.processor = processor
        self.telemetry = telemetry or Telemetry()
        self.broker = broker if broker is not None else make_broker(settings)
        self.tracker = OffsetTracker()
        self.keys = KeyIndex((settings.topics.retrieval, settings.topics.generation))
        self.state = LoopState()
        topics = settings.topics
        self._kinds = {
            topics.retrieval: InputKind.RETRIEVAL,
            topics.generation: InputKind.GENERATION,
            topics.feedback: InputKind.FEEDBACK,
        }
        self._destinations = {
            Destination.VERDICTS: topics.verdicts,
            Destination.CLAIMS: topics.claims,
            Destination.DLQ: topics.dlq,
            Destination.REPORTS: topics.reports,
        }
        self._inputs = (topics.retrieval, topics.generation, topics.feedback)
        # bytes one record may take per destination: the producer's request limit, the
        # DLQ topic's max.message.bytes; lowered to each topic's own setting at start
        request_limit = topics.max_message_bytes + REQUEST_SIZE_MARGIN_BYTES
        self.limits = {d: request_limit for d in Destination}
        self.limits[Destination.DLQ] = topics.max_message_bytes
        self._rng = random.Random()  # noqa: S311 - backoff jitter (instances out of step)
        common: dict[str, Any] = {
            "group_id": settings.kafka.group_id,
            "group_instance_id": settings.kafka.group_instance_id,
            "partition_assignment_strategy": (assignor or co_partition_assignor(),),
            "ack_policy": AckPolicy.MANUAL,
            "auto_offset_reset": settings.kafka.auto_offset_reset,
            "max_records": settings.kafka.max_poll_records,
            "session_timeout_ms": settings.kafka.session_timeout_ms,
            "fetch_max_wait_ms": settings.kafka.fetch_max_wait_ms,
            "max_partition_fetch_bytes": settings.kafka.max_partition_fetch_bytes,
            "listener": _Rebalance(self),
            "parser": self._indexing_parser,
            "decoder": _raw_decoder,
        }
        self._pipelined = settings.kafka.batch
        self.aligner = (
            InputAligner(
                topics.retrieval,
                topics.generation,
                slack_ms=settings.kafka.align_slack_ms,
                min_backlog=settings.kafka.max_poll_records,
            )
            if settings.kafka.align_inputs
            else None
        )
        if settings.kafka.batch:
            self.subscriber = self.broker.subscriber(
                topics.retrieval,
                topics.generation,
                topics.feedback,
                batch=True,
                batch_timeout_ms=settings.kafka.batch_timeout_ms,
                **common,
            )
            self.subscriber(self._on_batch)
        else:  # the baseline: one message per handler call, one confirmed publish at a time
            self.subscriber = self.broker.subscriber(
                topics.retrieval, topics.generation, topics.feedback, **common
            )
            self.subscriber(self._on_message)
        self._commit_lock = asyncio.Lock()
        self._handler_lock = asyncio.Lock()
        # the processor's CPU-bound work (segmentation, the verifier, lookback batches)
        # runs on one worker thread: the event loop keeps heartbeats and probes going
        self._worker = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="guardrail-processor")
            if settings.kafka.processing_thread
            else None
        )
        self._stopping = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self.lag: dict[tuple[str, int], int] = {}
        store = processor.store
        self.telemetry.observe(
            open_requests=lambda: len(store),
            evictions=lambda: store.evictions + store.expirations,
            lag=lambda: dict(self.lag),
        )
        counters = processor.counters
        self.telemetry.observe_counts(
            lambda: {
                "join.partition_mismatch": processor.intake.partition_mismatches,
                "join.byte_evictions": store.byte_evictions,
                "feedback.unmatched": counters.feedback_unmatched,
                "feedback.replaced": counters.feedback_replaced,
                "feedback.early": counters.feedback_early,
                "pipeline.internal_errors": counters.internal_errors,
            }
        )
        certifier = processor.signals.certifier
        statuses = getattr(certifier, "monitor_statuses", None)
        if statuses is not None:
            self.telemetry.observe_monitor(
                lambda: {
                    key: (st.m1_mean, st.interval.low, st.interval.high, st.broken)
                    for key, st in statuses().items()
                }
            )
        coverage = processor.signals.coverage
        gauges = getattr(coverage, "gauge_values", None)
        if gauges is not None:
            self.telemetry.observe_coverage(gauges)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.broker.start()
        await self._read_topic_limits()
        self._ticker = asyncio.create_task(self._tick_loop(), name="sidecar-ticker")
        self.state.started = True

    async def stop(self) -> None:
        """Graceful stop: pause intake, finish what is complete, commit the low watermark.

        Complete requests have had their verdicts published by the time the
        in-flight handler returns. Half-requests keep their offsets pending, so
        the committed position stays at or below their first input: whoever
        owns the partition next re-reads them and completes the join. The
        sidecar never writes into the LLM service's topics.
        """
        consumer = getattr(self.subscriber, "consumer", None)
        if consumer is not None and hasattr(consumer, "pause"):
            consumer.pause(*consumer.assignment())
        self._stopping.set()
        async with self._handler_lock:
            if self._ticker is not None:
                self._ticker.cancel()
                try:
                    await self._ticker
                except asyncio.CancelledError:
                    pass
            try:
                await self.commit()
            except KafkaError as exc:
                log.warning("final commit failed (%s); the next owner re-reads", exc)
        await self.subscriber.stop()
        await self.broker.stop()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
        self.state.started = False

    async def _indexing_parser(
        self, message: Any, original: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        """Note each record's key for the commit cut, then FastStream's (tolerant) parser."""
        for record in message if isinstance(message, tuple | list) else (message,):
            self.keys.note(
                record.topic, record.partition, record.offset, getattr(record, "key", None)
            )
        return await _tolerant_parser(message, original)

    @property
    def ready(self) -> bool:
        state = self.state
        return state.started and bool(state.assigned) and not state.split and state.topics_ok

    def on_assigned(self, assigned: set[tuple[str, int]]) -> None:
        """A new assignment: check that it keeps every partition number's inputs together."""
        self.state.assigned = assigned
        consumer = getattr(self.subscriber, "consumer", None)
        counts: dict[str, int] | None = None
        if consumer is not None and hasattr(consumer, "partitions_for_topic"):
            known = {t: consumer.partitions_for_topic(t) for t in self._inputs}
            counts = {t: len(parts) for t, parts in known.items() if parts is not None}
        self.state.split = split_pairs(assigned, self._inputs, counts)
        for problem in self.state.split:
            log.error(
                "assignment splits co-partitioned inputs: this member %s (group %s: every "
                "member must use the %s assignor); not ready",
                problem,
                self.settings.kafka.group_id,
                "guardrail-copartition",
            )

    # ------------------------------------------------------------------ consume

    async def _on_message(self, body: Any, msg: KafkaMessage) -> None:
        await self._handle((msg.raw_message,))

    async def _on_batch(self, body: Any, msg: KafkaMessage) -> None:
        await self._handle(msg.raw_message)

    async def _handle(self, records: tuple[ConsumerRecord[bytes, bytes], ...]) -> None:
        """Both subscriptions (batch and one-by-one) take this one path."""
        async with self._handler_lock:
            if self._stopping.is_set():
                return  # not tracked, not finished: the next owner reads it
            with self.telemetry.consuming(records, self.settings.kafka.group_id):
                await self._process(records)

    async def _process(self, records: tuple[ConsumerRecord[bytes, bytes], ...]) -> None:
        """One handled poll, inside its CONSUMER span (``_handle`` holds the lock)."""
        items = []
        for record in records:
            ref = InputRef(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                headers=tuple(record.headers or ()),
            )
            self.tracker.track(ref.tp, ref.offset)
            if self.aligner is not None:
                self.aligner.observe(record.topic, record.partition, record.timestamp)
            kind = self._kinds.get(record.topic)
            if kind is None:  # not ours (a pattern or misconfigured subscription)
                self.tracker.done(ref.tp, ref.offset)
                continue
            items.append((kind, record.value, record.key, ref))
        step = await self._in_worker(self.processor.on_batch, items, time.monotonic() * 1000.0)
        await self.emit(step)
        await self.align()

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a processor call on the worker thread (one at a time, in order)."""
        if self._worker is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def emit(self, step: Step, *, retry: bool = True) -> None:
        """Publish a step's outputs (retrying until confirmed), then finish its inputs.

        With ``retry=False`` (shutdown) a failed publish leaves the step's inputs
        unfinished, so they stay uncommitted and are read again. Pipelined (the
        default): every output is handed to the producer first and the
        confirmations are awaited together; what failed is retried one by one.
        An output too large for its topic is replaced by a dead letter that fits.
        """
        outputs = [self._fitted(out) for out in step.outputs]
        pending: list[tuple[Output, Any]] = [(out, None) for out in outputs]
        if self._pipelined and len(pending) > 1:
            pending = await self._publish_pipelined(outputs)
        for out, span in pending:
            if not await self._publish_one(out, span, retry=retry):
                return
        for ref in step.done:
            self.tracker.done(ref.tp, ref.offset)

    async def send_output(self, out: Output) -> Any:
        """Hand one output to the producer; returns what confirms it (a future or a result).

        The real broker gets the record through its aiokafka producer, header
        values as bytes. FastStream's in-memory test broker only carries text
        header values: there they are decoded (the in-memory path cannot carry
        bytes that are not UTF-8; the real-broker tests check those).
        """
        topic = self._destinations[out.destination]
        producer = self._producer()
        if producer is not None:
            return await producer.send(topic, out.value, key=out.key, headers=list(out.headers))
        text = {name: value.decode("utf-8", errors="replace") for name, value in out.headers}
        return await self.broker.publish(
            out.value, topic=topic, key=out.key, headers=text, no_confirm=True
        )

    def _producer(self) -> AIOKafkaProducer | None:
        """The broker's aiokafka producer once started; ``None`` in memory (TestKafkaBroker)."""
        state = getattr(self.broker.config.producer, "_producer", None)
        producer = getattr(state, "producer", None) if state else None
        return producer if isinstance(producer, AIOKafkaProducer) else None

    def _fitted(self, out: Output, limit: int | None = None, why: str = "") -> Output:
        """``out`` if it fits its destination, else a dead letter (cut down to fit the DLQ)."""
        topic = self._destinations[out.destination]
        size = record_size(out.key, out.value, out.headers)
        if out.destination is not Destination.DLQ:
            if size <= self.limits[out.destination]:
                return out
            why = f"{size} bytes with headers exceed the {self.limits[out.destination]}-byte limit"
            out = self._undeliverable(out, RecordTooLargeError(topic, why))
            size = record_size(out.key, out.value, out.headers)
        dlq = self._destinations[Destination.DLQ]
        limit = min(limit or self.limits[Destination.DLQ], self.limits[Destination.DLQ])
        why = why or (
            f"{size} bytes with headers exceed the {limit}-byte limit of {dlq} (max.message.bytes)"
        )
        fitted = fit_dead_letter(out, limit, why)
        if fitted is not out:
            self.state.truncated_dead_letters += 1
            log.warning("dead letter for %s truncated: %s", dlq, why)
        return fitted

    def _undeliverable(self, out: Output, error: RecordTooLargeError) -> Output:
        self.state.undeliverable_outputs += 1
        topic = self._destinations[out.destination]
        log.error("an output for %s can never be published (%s); dead-lettered", topic, error)
        reason = InputError("output-too-large", str(error))
        return undeliverable_output(out, topic, reason, failed_at=datetime.now(UTC))

    async def _publish_pipelined(self, outputs: list[Output]) -> list[tuple[Output, Any]]:
        """Send all, await all; returns the outputs that failed, with their open spans."""
        sent: list[tuple[Output, Any, Any]] = []
        failed: list[tuple[Output, Any]] = []
        for out in outputs:
            span = self.telemetry.before_publish(out, self._destinations[out.destination])
            try:
                future = await self.send_output(out)
            except (KafkaError, TimeoutError):
                failed.append((out, span))
                continue
            sent.append((out, span, future))
        results = await asyncio.gather(
            *(_confirmed(future) for _, _, future in sent), return_exceptions=True
        )
        for (out, span, _), result in zip(sent, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, KafkaError | TimeoutError):
                    raise result
                failed.append((out, span))
            else:
                self.telemetry.after_publish(span, result)
        return failed

    async def _publish_one(self, out: Output, span: Any, *, retry: bool) -> bool:
        """Publish and await confirmation; False when giving up (stopping, or ``retry=False``).

        Retriable errors: retried with capped, jittered backoff; ``state.publishing``
        turns false once they last ``publish_stall_s``. Too large: the output is
        replaced by a dead letter that fits (smaller each time the broker refuses
        one). Fatal (authorisation, configuration): logged once, ``state.live``
        false; the loop keeps retrying at the longest backoff until it is restarted.
        """
        topic = self._destinations[out.destination]
        if span is None:
            span = self.telemetry.before_publish(out, topic)
        attempt = 0
        while True:
            try:
                metadata = await _confirmed(await self.send_output(out))
            except (KafkaError, TimeoutError, GuardrailError) as exc:
                error = classify(exc, topic)
                if error.dead_letter:
                    try:
                        out = self._smaller(out, error)
                    except BrokerAccessError as refused:
                        error = refused
                    else:
                        continue
                if not retry or self._stopping.is_set():
                    log.warning("stopping: %s stays uncommitted and will be re-read", topic)
                    return False
                self._failing(error, exc, topic)
                delay = backoff_delay(attempt, self._rng)
                attempt += 1
                self.state.publish_retries += 1
                self.telemetry.publish_retries.add(1)
                log.warning("publish to %s failed (%s); retrying in %.2fs", topic, error, delay)
                await asyncio.sleep(delay)
            else:
                self.state.publish_failing_since = None
                self.telemetry.after_publish(span, metadata)
                return True

    def _smaller(self, out: Output, error: GuardrailError) -> Output:
        """After a too-large refusal: the dead letter to try instead (half the size, at most)."""
        size = record_size(out.key, out.value, out.headers)
        if out.destination is not Destination.DLQ:
            assert isinstance(error, RecordTooLargeError)  # noqa: S101 - dead_letter errors
            return self._fitted(self._undeliverable(out, error))
        if size // 2 < MIN_DLQ_BYTES:
            dlq = self._destinations[Destination.DLQ]
            raise BrokerAccessError(
                dlq, f"refuses a dead letter of {size} bytes; check its max.message.bytes"
            ) from error
        return self._fitted(out, size // 2, f"refused by the broker at {size} bytes: {error}")

    def _failing(self, error: BrokerError, exc: BaseException, topic: str) -> None:
        """Book a failed attempt: readiness after ``publish_stall_s``; liveness if fatal."""
        now = time.monotonic()
        if self.state.publish_failing_since is None:
            self.state.publish_failing_since = now
        persisted = now - self.state.publish_failing_since
        missing = isinstance(exc, UnknownTopicOrPartitionError)
        if missing and persisted >= UNKNOWN_TOPIC_FATAL_S:
            error = BrokerAccessError(topic, f"the topic does not exist (for {persisted:.0f}s)")
        if error.fatal and self.state.fatal is None:
            self.state.fatal = str(error)
            log.error("FATAL %s; not live until restarted", error)

    async def _read_topic_limits(self) -> None:
        """Lower ``limits`` to each output topic's own ``max.message.bytes`` (real broker)."""
        if self._producer() is None:
            return
        names = {topic: dest for dest, topic in self._destinations.items()}
        admin = AIOKafkaAdminClient(**aiokafka_client_args(self.settings.kafka))
        try:
            await admin.start()
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in names]
            )
        except KafkaError as exc:
            log.warning("cannot read the output topics' max.message.bytes (%s)", exc)
            return
        finally:
            await admin.close()
        for response in responses:
            for resource in response.resources:
                error_code, _message, _type, topic, entries = resource[:5]
                if error_code != 0 or topic not in names:
                    continue
                for entry in entries:
                    if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                        dest = names[topic]
                        self.limits[dest] = min(self.limits[dest], int(entry[1]))
        log.info("record limits per output topic: %s", self.limits)

    # ------------------------------------------------------------------ commits

    async def commit(self, only: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """Commit, for every partition that moved, its low-water mark lowered to a cut that
        tears no request apart across the joined topics (``sidecar/kafka/cut.py``)."""
        async with self._commit_lock:
            moved = self.tracker.committable()
            if only is not None:
                moved = {tp: off for tp, off in moved.items() if tp in only}
            if not moved:
                return {}
            low = {
                tp: mark
                for tp in self.keys.partners(moved)
                if (only is None or tp in only) and (mark := self.tracker.low_water(tp)) is not None
            }
            offsets = {
                tp: off
                for tp, off in self.keys.cut(low).items()
                if self.state.last_committed.get(tp) != off
            }
            consumer = getattr(self.subscriber, "consumer", None)
            if offsets and consumer is not None and hasattr(consumer, "commit"):
                await consumer.commit(
                    {TopicPartition(t, p): off for (t, p), off in offsets.items()}
                )
            self.tracker.mark_committed(moved)
            self.keys.committed(offsets)
            if offsets:
                self.state.commits += 1
                self.state.last_committed.update(offsets)
            return offsets

    async def _measure_lag(self) -> dict[tuple[str, int], int]:
        """Records per assigned partition not consumed yet: the lag gauge, the aligner's input."""
        consumer = getattr(self.subscriber, "consumer", None)
        if consumer is None or not hasattr(consumer, "highwater"):
            return {}
        self.lag = {tp: await self._backlog(consumer, tp) for tp in self.state.assigned}
        return self.lag

    async def _backlog(self, consumer: Any, tp: tuple[str, int]) -> int:
        """Records of ``tp`` in Kafka that this consumer has not handed out yet (0: unknown)."""
        part = TopicPartition(*tp)
        try:
            high = consumer.highwater(part)
            if high is None:  # not fetched yet: no fetch response, no position to wait for
                return 0
            seen = self.tracker.next_offset(tp)
            position = seen if seen is not None else await consumer.position(part)
        except (AssertionError, IllegalStateError):  # revoked meanwhile
            return 0
        return max(0, int(high) - int(position))

    async def align(self, backlog: dict[tuple[str, int], int] | None = None) -> None:
        """Pause / resume input partitions so that co-partitions stay aligned in time.

        ``backlog``: the lag just measured, if the caller has it (else measured here).
        """
        consumer = getattr(self.subscriber, "consumer", None)
        if self.aligner is None or consumer is None or not hasattr(consumer, "pause"):
            return
        if self._stopping.is_set():  # stop() paused everything; nothing resumes now
            return
        lag = backlog if backlog is not None else await self._measure_lag()
        decision = self.aligner.decide(self.state.assigned, lambda tp: lag.get(tp, 0))
        if decision.pause:
            consumer.pause(*(TopicPartition(*tp) for tp in decision.pause))
        if decision.resume:
            consumer.resume(*(TopicPartition(*tp) for tp in decision.resume))

    async def on_revoked(self, revoked: set[tuple[str, int]]) -> None:
        try:
            await self.commit(only=revoked)
        except KafkaError as exc:
            log.warning("commit before revocation failed (%s); the new owner re-reads", exc)
        dropped = await self._in_worker(self.processor.store.drop_partitions, revoked)
        self.tracker.forget(revoked)
        self.keys.forget(revoked)
        for tp in revoked:
            self.state.last_committed.pop(tp, None)
        if self.aligner is not None:
            self.aligner.forget(revoked)
        self.state.assigned -= revoked
        if dropped:
            log.info("revoked %s: %d open requests left to their new owner", revoked, dropped)

    async def _probe_broker(self) -> None:
        consumer = getattr(self.subscriber, "consumer", None)
        if consumer is None or not hasattr(consumer, "topics"):
            self.state.broker_ok = self.state.started
            return
        try:
            cluster = await asyncio.wait_for(_cluster_metadata(consumer), timeout=PROBE_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            if self.state.broker_ok:
                log.warning("broker unreachable (%s); not ready until it is back", exc)
            self.state.broker_ok = False
        else:
            if not self.state.broker_ok:
                log.info("broker reachable")
            self.state.broker_ok = True
            if cluster is not None:
                self._check_partition_counts(cluster)

    def _check_partition_counts(self, cluster: Any) -> None:
        """Readiness follows the input topics: all present, equal partition counts."""
        counts = {t: cluster.partitions_for_topic(t) for t in self._inputs}
        seen = {t: len(parts) for t, parts in counts.items() if parts is not None}
        problem = partition_count_problem(self._inputs, seen)
        first = not self.state.input_partitions
        if problem is None and not first and seen != self.state.input_partitions:
            problem = (
                f"partition counts changed from {format_counts(self.state.input_partitions)} to "
                f"{format_counts(seen)}; keys now hash to other partitions (restart the group)"
            )
        ok = problem is None
        if not ok and (self.state.topics_ok or seen != self.state.input_partitions):
            log.error("input topics: %s; not ready", problem)
        if first and ok:
            self.state.input_partitions = seen
        self.state.topics_ok = ok

    async def _probe_loop(self) -> None:
        """Readiness follows the broker on its own clock: a commit that aiokafka retries
        through a network stall must not freeze the probe (and /readyz with it)."""
        while not self._stopping.is_set():
            await self._probe_broker()
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _tick_loop(self) -> None:
        interval = self.settings.join.sweep_interval_ms / 1000.0
        prober = asyncio.create_task(self._probe_loop(), name="sidecar-broker-probe")
        try:
            await self._ticks(interval)
        finally:
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober

    async def _ticks(self, interval: float) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            try:
                step = await self._in_worker(self.processor.on_tick, time.monotonic() * 1000.0)
                await self.emit(step)
                await self.commit()
                await self.align(await self._measure_lag())
            except KafkaError as exc:
                log.warning("tick: %s (will retry)", exc)
