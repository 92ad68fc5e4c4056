"""The sidecar's Kafka app: a FastStream subscriber over aiokafka wired to the processor.

One subscriber reads both input topics in one consumer group with
``AckPolicy.MANUAL``: FastStream never commits on its own. The handler only
tracks what it consumed and queues it (``intake.py``); one task takes the
batches in order through the processor and hands their outputs to the
producer; each batch's inputs are finished once its outputs are confirmed,
while the next batch is worked on (``publish.py``); a ticker expires the join,
commits the low-water mark (``commits.py``), measures lag and adjusts which
partitions are paused; a probe keeps readiness current (``probe.py``). The
Kafka clients sit behind a port (``clients.py``): aiokafka's once started,
in-memory ones before (what FastStream's ``TestKafkaBroker`` drives).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.errors import KafkaError
from faststream import AckPolicy
from faststream.kafka import KafkaBroker

from guardrail_client.aio import cancel_and_wait
from sidecar.config import KafkaSettings, Settings
from sidecar.kafka.assignor import co_partition_assignor, deployment_of
from sidecar.kafka.clients import (
    TP,
    AiokafkaConsumerPort,
    ConsumerPort,
    KafkaClients,
    aiokafka_clients,
    memory_clients,
)
from sidecar.kafka.commits import Committer
from sidecar.kafka.cut import KeyIndex
from sidecar.kafka.handover import Handover, decode
from sidecar.kafka.intake import (
    IntakeControl,
    Records,
    WorkQueue,
    measure_lag,
    measure_uncommitted,
)
from sidecar.kafka.parsing import raw_decoder, tolerant_parser
from sidecar.kafka.publish import Publisher, request_size_bytes
from sidecar.kafka.readiness import BrokerProbe, ConsumerWatch, LoopState, watch_authorisation
from sidecar.kafka.records import input_headers, input_kinds, install_lenient_header_names
from sidecar.kafka.resets import installed as offset_resets
from sidecar.kafka.resets import watch_offset_resets
from sidecar.kafka.security import faststream_security
from sidecar.kafka.topics import input_topics
from sidecar.kafka.warmstart import ReadMarks, read_labels, recall, warm_start
from sidecar.kafka.withdrawals import CertificateBoard
from sidecar.lograte import PER_INPUT, report_repeats
from sidecar.osthreads import PROCESSOR_THREAD, name_this_thread
from sidecar.pipeline.backpressure import Backpressure, JoinClock
from sidecar.pipeline.flow import InputAligner
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.offsets import OffsetTracker
from sidecar.pipeline.outputs import INPUT_DESTINATIONS, Destination
from sidecar.pipeline.ports import HeldPartitions
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.pipeline.tally import Outcome
from sidecar.telemetry import Telemetry

log = logging.getLogger("sidecar.kafka")

_T = TypeVar("_T")

HANDOVER_TRIES = 3  # reads of the committed handovers on assignment before going without
HANDOVER_TIMEOUT_S = 10.0
REVOKE_SETTLE_S = 5.0  # on revocation, how long to wait for confirmations in flight
WITHDRAWALS_AT_STOP_S = 5.0  # at shutdown, how long the fleet's withdrawals may take


def make_broker(settings: Settings) -> KafkaBroker:
    """A FastStream Kafka broker with an idempotent producer and explicit topics."""
    kafka = settings.kafka
    return KafkaBroker(
        kafka.servers,
        client_id=kafka.client_id,
        request_timeout_ms=kafka.request_timeout_ms,
        security=faststream_security(kafka),
        allow_auto_create_topics=False,
        acks="all",
        enable_idempotence=True,
        max_request_size=request_size_bytes(settings.topics.max_message_bytes),
        logger=log,
        log_level=logging.DEBUG,
        graceful_timeout=settings.shutdown_grace_ms / 1000.0,
    )


def publish_destinations(settings: Settings) -> dict[Destination, str]:
    """The topic of each destination the sidecar publishes to: its outputs, and with
    ``join.reroute`` its input topics (a record off its request's partition is sent on)."""
    topics = settings.topics
    destinations = {
        Destination.VERDICTS: topics.verdicts,
        Destination.CLAIMS: topics.claims,
        Destination.DLQ: topics.dlq,
        Destination.REPORTS: topics.reports,
        Destination.CERTIFICATES: topics.certificates,
    }
    if settings.join.reroute:  # an input kind's destination bears its name
        for topic, kind in input_kinds(topics).items():
            destinations[Destination(kind.value)] = topic
    return destinations


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, service: SidecarService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._service.on_revoked({(tp.topic, tp.partition) for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._service.on_assigned({(tp.topic, tp.partition) for tp in assigned})


def _nothing() -> None:
    """A worker call that only marks its place in the queue."""


def _log_failure(done: Future[object]) -> None:
    """A worker call's done callback: log its exception, if any."""
    if not done.cancelled() and (error := done.exception()) is not None:
        log.error("a processor call nobody waited for failed", exc_info=error)


class SidecarService:
    """Wires a ``Processor`` to Kafka. Thin: decisions live in the processor."""

    def __init__(
        self,
        settings: Settings,
        processor: Processor,
        broker: KafkaBroker | None = None,
        telemetry: Telemetry | None = None,
        assignor: type[AbstractPartitionAssignor] | None = None,
        *,
        input_partitions: int | None = None,
        warm_start: bool = True,
    ) -> None:
        """``assignor``: the group's partition assignment strategy (default: a fresh
        ``CoPartitionAssignor``; tests pass aiokafka's round-robin as the control).
        ``input_partitions``: the input topics' partition count as Kafka gave it at start
        (default: ``topics.partitions``, the count ``topics create`` uses).
        ``warm_start``: read decided requests back from the verdicts topic, at start and
        for newly assigned partitions (``sidecar.kafka.warmstart``; False: the start's ACL
        check found the read refused, and said so)."""
        self.settings = settings
        self._warm_start = warm_start
        # the retrieval topic's partitions held since the last assignment
        self._held_numbers: frozenset[int] = frozenset()
        # how far the warm start and the recalls read each verdict partition: a recall reads
        # on from there (the first assignment's, only what the fleet decided since the start)
        self._verdicts_read: ReadMarks = {}
        self.processor = processor
        self.telemetry = telemetry or Telemetry()
        self.broker = broker if broker is not None else make_broker(settings)
        self.clients: KafkaClients = memory_clients(self.broker)  # aiokafka's from start()
        topics, kafka = settings.topics, settings.kafka
        self.tracker = OffsetTracker()
        self.keys = KeyIndex((topics.retrieval, topics.generation))
        self.state = LoopState(
            processing_stall_s=settings.http.processing_stall_s,
            processing_fatal_s=settings.http.processing_fatal_s,
            progress=getattr(processor, "progress", None),  # the bench's floors have none
        )
        self._stopping = asyncio.Event()
        # set while outputs can be published: the memory clients can at once; start() clears
        # it until the real producer is started (FastStream's consumer polls from inside
        # broker.start(): a backlog read before then waits in the queue)
        self._publishing = asyncio.Event()
        self._publishing.set()
        self._kinds = input_kinds(topics)
        self._topic_of_kind = {kind.value: topic for topic, kind in self._kinds.items()}
        self.handovers: dict[TP, Handover] = {}  # what the last owners finished (skipped)
        self.committer = Committer(self.tracker, self.keys, self.state, self.handovers)
        self.handover_skips = 0  # records skipped so (a counter for telemetry)
        # those of them the processor never sees (all but the generation topic's), by topic:
        # consumed records too (guardrail.consumer.records, outcome duplicate)
        self.handover_dropped: dict[str, int] = {}
        self._handovers_read = asyncio.Event()
        self._handovers_read.set()
        self._finished: set[tuple[str, int, int]] = set()  # kept records the handover named
        self.certificates: CertificateBoard | None = None
        destinations = publish_destinations(settings)
        self.probe = BrokerProbe(
            self.state,
            (topics.retrieval, topics.generation, topics.feedback),
            tuple(t for d, t in destinations.items() if d not in INPUT_DESTINATIONS),
            on_inputs_gone=self._forget_inputs,
        )
        self.consumer_watch = ConsumerWatch(self.state)
        self.publisher = Publisher(
            self.clients.producer,
            destinations,
            max_message_bytes=topics.max_message_bytes,
            state=self.state,
            tracker=self.tracker,
            telemetry=self.telemetry,
            stopping=self._stopping,
            pipelined=kafka.batch,
            in_flight=kafka.batches_in_flight,
        )
        aligner = (
            InputAligner(
                topics.retrieval,
                topics.generation,
                slack_ms=kafka.align_slack_ms,
                min_backlog=kafka.max_poll_records,
                # a pause that holds for more partner records than half the join store's
                # share of a partition is clock skew, not a backlog it can level
                max_lead_records=max(
                    kafka.max_poll_records,
                    settings.join.max_entries // (2 * (input_partitions or topics.partitions)),
                ),
                labels=topics.feedback,
            )
            if kafka.align_inputs
            else None
        )
        self.queue = WorkQueue()
        self.intake = IntakeControl(
            Backpressure(kafka.max_queued_records, max_bytes=kafka.max_queued_bytes),
            aligner,
            JoinClock(_monotonic_ms()),
        )
        common: dict[str, Any] = {
            "group_id": kafka.group_id,
            "group_instance_id": kafka.group_instance_id,
            "partition_assignment_strategy": (
                assignor or co_partition_assignor(deployment_of(topics)),
            ),
            "ack_policy": AckPolicy.MANUAL,
            "auto_offset_reset": kafka.auto_offset_reset,
            "isolation_level": kafka.isolation_level,
            "max_records": kafka.max_poll_records,
            "session_timeout_ms": kafka.session_timeout_ms,
            "rebalance_timeout_ms": kafka.rebalance_timeout_ms,
            "fetch_max_wait_ms": kafka.fetch_max_wait_ms,
            "max_partition_fetch_bytes": kafka.max_partition_fetch_bytes,
            "listener": _Rebalance(self),
            "parser": self._indexing_parser,
            "decoder": raw_decoder,
            # FastStream would publish the handler's return value to the topic a record's
            # ``reply_to`` header names: a producer could make the sidecar write anywhere
            "no_reply": True,
        }
        self.subscriber = self._subscribe(kafka, common)
        self._handler_lock = asyncio.Lock()
        # the processor's CPU-bound work (segmentation, the verifier, lookback batches)
        # runs on one worker thread: the event loop keeps heartbeats and probes going
        # (named PROCESSOR_THREAD for the system: its CPU is the deciding's, ``osthreads``)
        self._worker = (
            ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="guardrail-processor",
                initializer=self._worker_started,
            )
            if kafka.processing_thread
            else None
        )
        self._worker_clock: int | None = None  # the worker thread's CPU clock, once it runs
        self._worker_cpu_s = 0.0  # its last reading
        self._ticker: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None
        # partitions revoked while the drainer holds a batch it took from the queue and
        # waits for the handler lock (``None``: it holds none)
        self._revoked_in_hand: set[TP] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._calls = itertools.count()
        self._worker_calls: dict[int, float] = {}  # token -> monotonic start, calls out
        # per partition: records from the commit point to the end (the lag gauge), measured
        # by the watchdog every second (the ticker stops when the processor is held)
        self.uncommitted: dict[TP, int] = {}
        # what stop() is doing now, and whether its final commit was confirmed: what the
        # line says when the shutdown grace runs out first (``runtime.serve``)
        self.stop_step = ""
        self.final_commit_confirmed = False
        self._observe()

    @property
    def aligner(self) -> InputAligner | None:
        return self.intake.aligner

    @property
    def backpressure(self) -> Backpressure:
        return self.intake.backpressure

    @property
    def lag(self) -> dict[TP, int]:
        return self.intake.lag

    @property
    def ready(self) -> bool:
        state = self.state
        return state.started and bool(state.assigned) and not state.split and state.topics_ok

    def consumed(self) -> dict[tuple[str, str], int]:
        """Input records consumed, ``(topic, outcome) -> n``: the processor's tally by kind
        under the configured topic names, and the records a handover skipped before it."""
        topics = self._topic_of_kind
        counts = {
            (topics[kind], outcome): n
            for (kind, outcome), n in self.processor.counters.inputs.counts().items()
        }
        for topic, n in dict(self.handover_dropped).items():
            counts[(topic, Outcome.DUPLICATE.value)] += n
        return counts

    def _observe(self) -> None:
        processor = self.processor
        store, counters = processor.store, processor.counters
        self.telemetry.observe(
            open_requests=lambda: len(store),
            evictions=lambda: store.evictions + store.expirations,
            lag=lambda: dict(self.uncommitted),
        )
        self.telemetry.observe_counts(
            lambda: {
                "join.partition_mismatch": processor.intake.partition_mismatches,
                "join.misrouted": processor.intake.misrouted,
                "join.rerouted": processor.intake.rerouted,
                "join.rerouted_late": processor.intake.rerouted_late,
                "join.rereads": processor.intake.rereads,
                "claims.refused": processor.scoring.claims_refused,
                "join.byte_evictions": store.byte_evictions,
                "feedback.unmatched": counters.feedback_unmatched,
                "feedback.replaced": counters.feedback_replaced,
                "feedback.early": counters.feedback_early,
                "pipeline.internal_errors": counters.internal_errors,
                "kafka.backpressure_pauses": self.backpressure.pauses,
                "kafka.handover_skips": self.handover_skips,
                "kafka.commit_fallbacks": self.committer.fallbacks,
                "kafka.commit_holds": self.committer.holds,
                "join.clock_held_ms": int(self.intake.clock.held_ms),
                "lookback.mismatches": getattr(processor.signals.lookback, "mismatches", 0),
                "coverage.evicted_keys": getattr(processor.signals.coverage, "evicted_keys", 0),
                # the process's watch, once start() installed it
                "kafka.offset_resets": watch.resets if (watch := offset_resets()) else 0,
            }
        )
        self.telemetry.observe_gauges(
            lambda: {
                "queue.records": self.queue.records,
                "queue.bytes": self.queue.bytes,
                "consumer.paused_partitions": len(self.intake.paused),
            }
        )
        self.telemetry.observe_consumed(self.consumed)
        self.telemetry.observe_processor_cpu(self.processor_cpu_s)
        # what /readyz and /livez answer, read at collection (nothing per request)
        requires_assignment = self.settings.http.ready_requires_assignment
        self.telemetry.observe_gauges(
            lambda: {
                "ready": int(
                    self.state.started
                    and all(self.state.readiness_checks(requires_assignment).values())
                ),
                "live": int(all(self.state.liveness_checks().values())),
            }
        )
        judge = getattr(processor.signals.claims, "judge", None)  # VerifierClaimChecker's
        if judge is not None:
            self.telemetry.observe_counts(judge.counts)
            self.telemetry.observe_gauges(lambda: {"judge.breaker_open": int(judge.open)})
        self.telemetry.preset_verdicts(processor.policy.profile_names)
        signals = processor.signals
        if signals.certifier is not None:
            readings = signals.certifier.monitor_readings
            self.telemetry.observe_monitor(
                lambda: {k: (r.m1_mean, r.low, r.high, r.broken) for k, r in readings().items()},
                max_keys=self.settings.metrics.max_key_series,
            )
        if signals.coverage is not None:
            self.telemetry.observe_coverage(
                signals.coverage.gauge_values, max_keys=self.settings.metrics.max_key_series
            )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._publishing.clear()
        # before the consumer reads anything
        install_lenient_header_names(
            max_batch_inflated_bytes=self.settings.kafka.max_batch_inflated_bytes,
            max_poll_bytes=self.settings.kafka.max_poll_bytes,
        )
        watch_offset_resets(self.settings.kafka.auto_offset_reset)  # and say when it resets
        if self.processor.certificates is not None:  # the fleet's withdrawals, before deciding
            self.certificates = CertificateBoard(
                self.settings, self.processor.certificates, on_refused=self.state.fail
            )
            await self.certificates.start()
        if self._warm_start and self.processor.signals.warm_starts:  # as the fleet left them
            await warm_start(self.settings, self.processor, self._verdicts_read)
        await self.broker.start()
        kafka = self.settings.kafka
        request_size = request_size_bytes(self.settings.topics.max_message_bytes)
        self.clients = aiokafka_clients(self.subscriber.consumer, kafka, request_size)
        self.publisher.producer = self.clients.producer
        own = await self.publisher.read_topic_limits()
        if own:  # the broker checks max.message.bytes per batch: none may be larger
            await self.clients.producer.limit_batches(min(own.values()))
        await self.clients.producer.start()
        self._publishing.set()
        self._ticker = self._background(self._tick_loop(), "sidecar-ticker")
        self._watchdog = self._background(self._watch_processor(), "sidecar-watchdog")
        self.state.started = True

    async def close_unstarted(self) -> None:
        """Close what a start cut short (a SIGTERM while the clients started) had opened:
        nothing was decided yet, so there is nothing to commit."""
        await self.broker.stop()
        await self.clients.producer.stop()
        if self.certificates is not None:
            await self.certificates.stop()
        if self._worker is not None:
            self._worker.shutdown(wait=False)

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task the loop needs until stop(): one that ends before (a bug out of it) is
        fatal, so the pod restarts with the cause in its log. Unwatched, a ticker gone made
        no more commits nor TTL sweeps while the probes stayed green."""
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._background_ended)
        return task

    def _background_ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping.is_set() or task.cancelled():
            return
        exc = task.exception()
        why = f"{exc!r}" if exc is not None else "it returned"
        self.state.fail(f"the {task.get_name()} task ended ({why}) while the sidecar runs")
        if exc is not None:
            log.error("the %s task ended", task.get_name(), exc_info=exc)

    async def stop(self) -> None:
        """Graceful stop: pause intake, finish the part in hand, commit the low watermark.

        Complete requests have had their verdicts published by the time the
        part of the batch in hand is through (``_work_on``); the rest of that batch,
        queued batches and half-requests keep their
        offsets pending, so the committed position stays at or below them:
        whoever owns the partition next re-reads them and completes the join.
        Nothing is written back into the LLM service's topics to finish later (the only
        records the sidecar writes there are reroutes: ``join.reroute``).
        """
        consumer = self.clients.consumer
        consumer.pause(consumer.assignment())
        self._stopping.set()
        self.queue.wake()
        self.stop_step = "waiting for the processor's call in hand"
        async with self._handler_lock:
            self.stop_step = "stopping the ticker"
            for task in (self._ticker, self._drainer, self._watchdog):
                if task is not None and not task.done():  # one that ended was said fatal
                    error = await cancel_and_wait(task)
                    if error is not None:  # it failed as it was cancelled: said, stop goes on
                        log.error("the %s task ended", task.get_name(), exc_info=error)
            # the steps in flight: confirmed, or left pending for the next owner (bounded, so
            # the commit of what is through and the clients' close fit the grace period)
            self.stop_step = "waiting for the broker to confirm the last verdicts"
            settle_s = self.settings.shutdown_grace_ms / 2000
            if not await self.publisher.settle(settle_s):
                abandoned = self.publisher.abandon()
                log.warning(
                    "stopping: %d step(s) not confirmed within %.1f s; their inputs stay "
                    "uncommitted and are read again",
                    abandoned, settle_s,
                )  # fmt: skip
            self.stop_step = "publishing certificate withdrawals"
            await self._withdrawals_at_stop()
            self.stop_step = "the final commit"
            try:
                await self.committer.commit(consumer)
                self.final_commit_confirmed = True
            except KafkaError as exc:
                log.warning("final commit failed (%s); the next owner re-reads", exc)
        self.stop_step = "closing the Kafka clients"
        await self.subscriber.stop()
        await self.broker.stop()
        await self.clients.producer.stop()
        if self.certificates is not None:
            await self.certificates.stop()
        if self._worker is not None:
            # the calls submitted before (a tick's, whose task was cancelled above while its
            # call ran on) finish first, awaited on the loop: ``shutdown(wait=True)`` blocked
            # the loop, so a call that never returns held the process past the shutdown grace
            # for good, until the kubelet's SIGKILL (audit: a hung on_tick, 90 s and counting)
            self.stop_step = "waiting for the processor's last calls"
            last = self._worker.submit(_nothing)
            self._worker.shutdown(wait=False)
            await asyncio.wrap_future(last)
        self.stop_step = ""
        self.state.started = False

    async def _withdrawals_at_stop(self) -> None:
        """Withdrawals the fleet's topic has not shown back (one found a moment ago, one
        whose publish a stopping tick cut short) go out once more: this replica's re-test
        window is forgotten when it exits, the topic is what remembers."""
        step = self.processor.withdrawals(unconfirmed=True)  # the tracker has its own lock
        if not step.outputs:
            return
        try:
            async with asyncio.timeout(WITHDRAWALS_AT_STOP_S):
                await self.publisher.emit(step, retry=False)
        except (KafkaError, TimeoutError) as exc:
            log.warning(
                "stopping: %d certificate withdrawal(s) not published (%r); the replica that "
                "finds the certificate broken again announces it",
                len(step.outputs), exc,
            )  # fmt: skip

    async def commit(self, only: set[TP] | None = None) -> dict[TP, int]:
        return await self.committer.commit(self.clients.consumer, only)

    # ------------------------------------------------------------------ rebalance

    def _group_consumer(self) -> ConsumerPort:
        """The group's consumer: the first assignment comes while the broker starts, before
        start() has the clients (whose stand-in knows no partition counts and no commits)."""
        group = getattr(self.subscriber, "consumer", None)
        if isinstance(group, AIOKafkaConsumer):
            return AiokafkaConsumerPort(group)
        return self.clients.consumer

    async def on_assigned(self, assigned: set[TP]) -> None:
        counts = self._group_consumer().known_partitions(self.probe.inputs)
        self.probe.check_assignment(assigned, counts, self.settings.kafka.group_id)
        self._note_assignment()
        self._handovers_read.clear()  # records that come meanwhile wait for it (_handle)
        try:
            await self._take_handovers(assigned)
            await self._move_coverage(assigned, counts)
        finally:
            self._handovers_read.set()
        if not self._stopping.is_set():  # new partitions come unpaused: pause what is due
            self.intake.apply(self._group_consumer(), assigned)

    async def _move_coverage(self, assigned: set[TP], counts: dict[str, int]) -> None:
        """The coverage windows move with the partitions. Partitions this replica did not
        hold before (another one stopped, the group shrank or grew) bring the requests
        decided there by another replica (``warmstart.recall``: their verdicts, kept for
        their labels) and those requests' labels (``warmstart.read_labels``: the feedback
        topic's tail), both read back before the partitions' records are handled; the first
        assignment too (its partitions' last owner went on deciding between the start's
        warm start and the join). Then the windows of partitions read elsewhere now are
        dropped and the new ones refilled from what was read back
        (``Processor.hold_partitions``)."""
        retrieval = self.settings.topics.retrieval
        numbers = frozenset(p for t, p in assigned if t == retrieval)
        new, self._held_numbers = numbers - self._held_numbers, numbers
        count = counts.get(retrieval)
        if not count or self.processor.signals.coverage is None:
            return
        labels = None
        if new and self._warm_start:  # the two reads side by side: records wait for both
            _, labels = await asyncio.gather(
                recall(self.settings, self.processor, new, count, self._verdicts_read),
                read_labels(self.settings, self.processor, new, count),
            )
        held = self.processor.hold_partitions(numbers, count, labels or ())
        if held is None:
            return
        if not (held.unknown or held.gone):
            _say_windows_moved(held)
            return
        # the waiting labels are the processor's: on its thread, after the batch in hand
        # (which may outlast a rebalance: not waited for here) and before any batch with
        # these partitions' records (they wait for this assignment's end to be queued)
        now, wall = self.intake.clock.read(_monotonic_ms()), time.time() * 1000.0
        self._after_batch_in_hand(self._move_waiting_labels, held, count, now, wall)

    def _move_waiting_labels(
        self, held: HeldPartitions, count: int, now_ms: float, wall_ms: float
    ) -> None:
        """``Processor.move_waiting_labels``, then the assignment's line (the worker's)."""
        _say_windows_moved(held, self.processor.move_waiting_labels(held, count, now_ms, wall_ms))

    def _note_assignment(self) -> None:
        """Tell intake which partitions this replica reads: a record off its request's
        partition is joined here when that partition is one of them, rerouted when not."""
        intake = getattr(self.processor, "intake", None)  # the bench's floors have none
        if intake is not None:
            intake.local_partitions = frozenset(self.state.assigned)

    async def _take_handovers(self, assigned: set[TP]) -> None:
        """Read what the partitions' last owner finished above its commit (its handover),
        so that those records are skipped, not decided a second time or by halves."""
        wanted = {tp for tp in assigned if tp[0] in self.keys.joined}
        consumer = self._group_consumer()
        found: dict[TP, tuple[int, str]] | None = None
        for attempt in range(1, HANDOVER_TRIES + 1):
            try:
                async with asyncio.timeout(HANDOVER_TIMEOUT_S):
                    found = await consumer.committed_metadata(wanted)
                break
            except (KafkaError, TimeoutError) as exc:
                log.warning("reading the committed handovers failed (%r), try %d", exc, attempt)
                await asyncio.sleep(0.2 * attempt)
        if found is None:
            log.warning(
                "no handover read for %s: the records their last owner finished are read "
                "again, and a request it decided across the commit may be answered incomplete",
                sorted(wanted),
            )
            return
        skipping = 0
        for tp, (offset, metadata) in found.items():
            self.committer.assigned_with(tp, offset, metadata)
            handover = decode(offset, metadata)
            if handover is not None and handover.horizon > handover.start:
                self.handovers[tp] = handover
                skipping += 1
        if skipping:
            log.info("assigned %d partitions with a handover from their last owner", skipping)

    def _skip_finished(self, records: Records) -> Records:
        """``records`` less those the partition's last owner finished (each finished here at
        once); a partition's handover is dropped once its reading passes the horizon.

        Finished records of the generation topic stay, flagged (``_finished``): the
        processor remembers a final's request as decided, so a late event of it is
        ``after-final`` here too."""
        kept = []
        generation = self.settings.topics.generation
        for record in records:
            tp = (record.topic, record.partition)
            handover = self.handovers.get(tp)
            if handover is not None:
                if handover.finished(record.offset):
                    self.handover_skips += 1
                    if record.topic == generation:
                        self._finished.add((record.topic, record.partition, record.offset))
                        kept.append(record)
                    else:
                        self.tracker.done(tp, record.offset)
                        dropped = self.handover_dropped
                        dropped[record.topic] = dropped.get(record.topic, 0) + 1
                    continue
                if record.offset + 1 >= handover.horizon:
                    del self.handovers[tp]
            kept.append(record)
        return tuple(kept)

    async def on_revoked(self, revoked: set[TP]) -> None:
        # nothing more of theirs goes to the processor (nor the rest of the batch in hand);
        # the part it has in hand goes through to its publish first, then the steps in flight
        # finish their inputs once confirmed (milliseconds): waited for, bounded, so the
        # commit below covers their verdicts and the new owner does not decide them again
        # (audit: committed before the batch in hand was through, whose requests the new
        # owner then decided a second time, 8 of 30)
        queued = self._drop_queued(revoked)
        in_hand = await self._batch_in_hand_through()
        try:
            await self.publisher.settle(REVOKE_SETTLE_S)
            try:
                await self.commit(only=revoked)
            except KafkaError as exc:
                log.warning("commit before revocation failed (%s); the new owner re-reads", exc)
            queued += self._drop_queued(revoked)  # and what the drainer took meanwhile
            if in_hand:
                dropped = await self._in_worker(self.processor.store.drop_partitions, revoked)
            else:  # after the batch in hand, before any later one (the worker keeps the order)
                dropped = 0
                self._after_batch_in_hand(self.processor.store.drop_partitions, revoked)
        finally:
            if in_hand:
                self._handler_lock.release()
        self.committer.forget(revoked)
        self.intake.forget(revoked)
        for tp in revoked:
            self.handovers.pop(tp, None)
        self._finished = {f for f in self._finished if (f[0], f[1]) not in revoked}
        self.state.assigned -= revoked
        self._note_assignment()
        self._queue_changed()  # the queue shrank: a backpressure pause may be over
        if dropped or queued:
            log.info(
                "revoked %s: %d open requests, %d queued records left to their new owner",
                revoked,
                dropped,
                queued,
            )

    def _drop_queued(self, revoked: set[TP]) -> int:
        """Drop ``revoked``'s queued records, and those of the batch the drainer took from the
        queue and waits to process: it processes them after the revocation, which has
        committed without them and forgotten their offsets (audit: decided again by the
        new owner, which re-reads them). How many were queued."""
        if self._revoked_in_hand is not None:
            self._revoked_in_hand |= revoked
        return self.queue.drop(revoked)

    async def _batch_in_hand_through(self) -> bool:
        """Take the handler lock once the part of a batch in the processor is published
        (True), or give up after half the time the group waits for this member to rejoin
        (False).

        A part is ``GUARDRAIL_KAFKA__PART_BUDGET_MS`` of work and then the record at which
        it ran out, whose claims can take long on a throttled CPU; before parts, a batch
        (500 answers of 64 claim pairs) could outlast any rebalance timeout: waiting for it
        past that dropped the member from the group, and two replicas took the partitions
        from each other for good (audit). Left out, its requests on the revoked partitions
        may be decided again by their new owner, under the same idempotency keys."""
        wait_s = self.settings.kafka.rebalance_timeout_ms / 2000
        try:
            async with asyncio.timeout(wait_s):
                await self._handler_lock.acquire()
        except TimeoutError:
            log.warning(
                "revocation: the batch in the processor is not through after %.0f s (half of "
                "GUARDRAIL_KAFKA__REBALANCE_TIMEOUT_MS); committing without it: its requests "
                "on the revoked partitions may be decided again by their new owner",
                wait_s,
            )
            return False
        return True

    def _after_batch_in_hand(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn`` on the worker thread after the call it has in hand, not waiting for it;
        its failure is logged (nobody awaits it: it went unseen, audit)."""
        if self._worker is None:
            fn(*args)
        else:
            self._worker.submit(fn, *args).add_done_callback(_log_failure)

    def _forget_inputs(self, topics: set[str]) -> None:
        """Input ``topics`` were deleted under the loop: forget their partitions' offsets.

        The broker drops a deleted topic's committed offsets; the tracker's, retried by
        every commit until one succeeded, used to land on the topic created again under
        the same name (audit: the consumer then started there, the new topic's first
        records were skipped without a word, and the old handover marked some of the new
        ones finished: requests with no verdict at all); meanwhile that commit held up the
        ticks (TTL sweeps, every other partition's commits). Forgotten, and the commit in
        flight abandoned, nothing is committed for them: a topic created again is read
        from ``auto_offset_reset``.

        The topics' incarnation moves on (``OffsetTracker.retire``): requests still open
        with their records, and a batch the worker is deciding now, finish nothing of the
        new topic when decided (before, their ``done`` landed on the new topic's record at
        the same offset, whose commit then went past it with no verdict). Their records
        still queued are dropped, and so are those of a batch the drainer took from the
        queue and waits to process: ``_process`` tags a record with the incarnation current
        when it builds its ref, which would be the new topic's.
        """
        gone = {tp for tp in self.state.assigned if tp[0] in topics}
        self.committer.abandon()
        self.committer.forget(gone)
        self.tracker.retire(topics)
        queued = self._drop_queued(gone)  # and a batch the drainer holds, as at a revocation
        self._queue_changed()
        for tp in gone:
            self.handovers.pop(tp, None)
        self._finished = {f for f in self._finished if (f[0], f[1]) not in gone}
        log.warning(
            "input topic(s) %s deleted: what was read from them is not committed, and "
            "their %d records still queued are dropped; created again, they are read from "
            "GUARDRAIL_KAFKA__AUTO_OFFSET_RESET (%s)",
            ", ".join(sorted(topics)), queued, self.settings.kafka.auto_offset_reset,
        )  # fmt: skip

    # ------------------------------------------------------------------ consume

    def _subscribe(self, kafka: KafkaSettings, common: dict[str, Any]) -> Any:
        """The input topics' subscriber, its handler attached; a fetch the cluster refuses
        (an ACL removed) makes the loop not live."""
        inputs = input_topics(self.settings)
        if kafka.batch:
            subscriber = self.broker.subscriber(
                *inputs, batch=True, batch_timeout_ms=kafka.batch_timeout_ms, **common
            )
            subscriber(self._on_batch)
        else:  # the baseline: one message per handler call, one confirmed publish at a time
            subscriber = self.broker.subscriber(*inputs, **common)
            subscriber(self._on_message)
        watch_authorisation(subscriber, self.state)
        return subscriber

    async def _indexing_parser(
        self, message: Any, original: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        """Note each record's key for the commit cut, then FastStream's (tolerant) parser."""
        for record in message if isinstance(message, tuple | list) else (message,):
            self.keys.note(record.topic, record.partition, record.offset, record.key)
        return await tolerant_parser(message, original)

    async def _on_message(self, record: Any) -> None:
        await self._handle((record,))  # ``raw_decoder``: the consumer's record itself

    async def _on_batch(self, records: Any) -> None:
        await self._handle(tuple(records))  # ``raw_decoder``: the poll's records

    async def _handle(self, records: Records) -> None:
        """Both subscriptions take this one path: track, queue, pause if the queue is full.

        The handler never waits for the processor, so the consumer keeps polling
        (and its group membership) while a slow batch is worked on. Only in memory,
        where nothing fetches and pausing cannot stop the input, does it wait for
        room past the limit (depth plus one poll).
        """
        if self._stopping.is_set():
            return  # not tracked, not finished: the next owner reads it
        if not self._handovers_read.is_set():  # an assignment's handovers are being read
            await self._handovers_read.wait()
        aligner = self.intake.aligner
        for record in records:
            self.tracker.track((record.topic, record.partition), record.offset)
            if aligner is not None:
                aligner.observe(record.topic, record.partition, record.timestamp)
        # the poll that returned these is the consumer's latest: its positions are past every
        # record it handed out, and past the markers that end transactions after them
        consumer = self.clients.consumer
        for tp in self.state.assigned:
            if (position := consumer.position(tp)) is not None:
                self.tracker.skipped_to(tp, position)
        if self.handovers:
            records = self._skip_finished(records)
        self.queue.put(records)
        self._queue_changed()
        if aligner is not None:  # align at intake: the queue keeps the order it is read in
            await self.align()
        if self._drainer is None:
            self._drainer = self._background(self._drain(), "sidecar-processor")
        kafka = self.settings.kafka
        await self.queue.wait_for_room(
            kafka.max_queued_records + kafka.max_poll_records,
            self._stopping,
            max_bytes=kafka.max_queued_bytes,
        )

    def _queue_changed(self) -> None:
        if self._stopping.is_set():  # stop() paused everything; nothing resumes now
            return
        self.intake.on_queue(
            self.queue.records,
            self.clients.consumer,
            self.state.assigned,
            _monotonic_ms(),
            self.queue.bytes,
        )

    async def _drain(self) -> None:
        """The processor's one task: queued batches in order, each through to its commit."""
        await self._publishing.wait()  # not into a producer that start() may still replace
        while True:
            records = await self.queue.get()
            self._queue_changed()
            self._revoked_in_hand = set()
            try:
                await self._work_on(records)
            except Exception:  # as a handler's error was: logged, its inputs left pending
                log.exception("processing a batch of %d records failed", len(records))
            finally:
                self._revoked_in_hand = None

    async def _work_on(self, records: Records) -> None:
        """One consumed batch, in parts (``GUARDRAIL_KAFKA__PART_BUDGET_MS`` of processor
        work each), each part's outputs handed to the publisher before the next part.

        Each part holds the handler lock, so a stop or a revocation waiting for the
        processor takes it between two parts, not after the whole batch (with claims on,
        a backlog's poll of 100 answers took 11-19 s to verify, ``bench/batch_parts.py``):
        after a stop the rest
        of the batch stays pending for the next owner, after a revocation the rest loses
        the revoked partitions' records (as queued batches do), whose new owner reads
        them. The batch's CONSUMER span covers all its parts; the join clock stands
        still while some of its records wait for a later part (``_left_in_hand``).
        """
        budget_ns = self.settings.kafka.part_budget_ms * 1_000_000 or None
        items: list[BatchItem] | None = None
        start = 0
        with contextlib.ExitStack() as span:
            span.callback(self._left_in_hand, 0)
            while items is None or start < len(items):
                async with self._handler_lock:
                    revoked, self._revoked_in_hand = self._revoked_in_hand, set()
                    if self._stopping.is_set():
                        return
                    if items is None:
                        if revoked:  # a revocation came first: left to the new owner
                            records = tuple(
                                r for r in records if (r.topic, r.partition) not in revoked
                            )
                        if not records:
                            return
                        span.enter_context(
                            self.telemetry.consuming(records, self.settings.kafka.group_id)
                        )
                        items = self._items(records)
                    elif revoked:  # between two parts: the rest is the new owner's
                        items = [item for item in items[start:] if item[3].tp not in revoked]
                        start = 0
                    if start >= len(items):
                        return
                    now = self.intake.clock.read(_monotonic_ms())
                    step, start = await self._in_worker(
                        self.processor.on_part, items, start, now, budget_ns
                    )
                    await self.publisher.submit(step)
                    self._left_in_hand(len(items) - start)

    def _left_in_hand(self, records: int) -> None:
        """The batch in hand has ``records`` its parts have not reached: while it has any,
        the join clock stands still, as for queued records (the join TTL is not charged
        for the processor's work on the parts before them)."""
        if records != self.intake.in_hand:
            self.intake.in_hand = records
            self._queue_changed()

    def _items(self, records: Records) -> list[BatchItem]:
        """The processor's view of consumed records (ours only: another topic's are done)."""
        items: list[BatchItem] = []
        # the partition count each record's topic has now: intake checks it is where its
        # request id hashes to (a producer with another partitioner tears requests apart)
        counts = self.clients.consumer.known_partitions(self._kinds)
        for record in records:
            ref = InputRef(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                headers=input_headers(record.headers),
                timestamp_ms=record.timestamp,
                finished=bool(self._finished)
                and (record.topic, record.partition, record.offset) in self._finished,
                incarnation=self.tracker.incarnation(record.topic),
                partitions=counts.get(record.topic, 0),
            )
            if ref.finished:
                self._finished.discard((record.topic, record.partition, record.offset))
            kind = self._kinds.get(record.topic)
            if kind is None:  # not ours (a pattern or misconfigured subscription)
                self.tracker.done(ref.tp, ref.offset)
                continue
            items.append((kind, record.value, record.key, ref))
        return items

    async def align(self) -> None:
        """Measure lag, then pause / resume input partitions (alignment, backpressure)."""
        if self._stopping.is_set():  # stop() paused everything; nothing resumes now
            return
        consumer = self.clients.consumer
        # the records of a poll FastStream has not handed to ``_handle`` yet are past the
        # position and not queued: for that moment (no await) they count as not behind
        lag = measure_lag(consumer, self.state.assigned, self.tracker)
        queue = self.queue
        self.intake.align(
            consumer,
            self.state.assigned,
            lag,
            queue.records,
            _monotonic_ms(),
            queued_bytes=queue.bytes,
        )

    def _worker_started(self) -> None:
        """On the worker thread, before its first call: its name for the system, and the
        clock of its CPU (``processor_cpu_s``)."""
        name_this_thread(PROCESSOR_THREAD)
        clock_of = getattr(time, "pthread_getcpuclockid", None)  # not on every system
        if clock_of is not None:
            self._worker_clock = clock_of(threading.get_ident())

    def processor_cpu_s(self) -> float:
        """The CPU seconds (user and system) the processor's worker thread has spent:
        deciding, and the claim verifier's calls on it (``guardrail.processor.cpu_time``;
        the process's own CPU less this is the loop's; with
        ``GUARDRAIL_SIGNALS__VERIFIER_THREADS`` above 1, onnxruntime's other threads are
        the loop's share). 0 until its first call, and without a worker thread
        (``GUARDRAIL_KAFKA__PROCESSING_THREAD=false``) or a thread clock."""
        if self._worker_clock is not None:
            try:
                self._worker_cpu_s = time.clock_gettime(self._worker_clock)
            except OSError:  # the thread has ended (stopped): its last reading stands
                self._worker_clock = None
        return self._worker_cpu_s

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run a processor call on the worker thread (one at a time, in order); while it is
        out, ``state.processing_since`` holds the oldest such call's start."""
        if self._worker is None:
            return fn(*args)
        token = next(self._calls)
        self._worker_calls[token] = time.monotonic()
        self.state.processing_since = min(self._worker_calls.values())
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        finally:
            del self._worker_calls[token]
            self.state.processing_since = min(self._worker_calls.values(), default=None)

    async def _watch_processor(self) -> None:
        """Say when a call holds the processor without progress past ``processing_stall_s``
        (not ready) and ``processing_fatal_s`` (not live), and when it is through: the
        ticker cannot, as its own calls wait behind that one; and measure the lag gauge."""
        state, said = self.state, 0  # 0: nothing said, 1: stalled, 2: wedged
        interval = min(1.0, state.processing_stall_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.uncommitted = measure_uncommitted(
                self.clients.consumer, state.assigned, self.tracker
            )
            held = state.processing_for()
            if said < 1 and held >= state.processing_stall_s:
                said = 1
                log.error(
                    "the processor has made no progress on its call for %.0f s (a hung "
                    "call?): nothing is decided meanwhile; not ready, and not live after %.0f s "
                    "(GUARDRAIL_HTTP__PROCESSING_STALL_S, __PROCESSING_FATAL_S)",
                    held,
                    state.processing_fatal_s,
                )
            if said < 2 and held >= state.processing_fatal_s:
                said = 2
                log.error(
                    "the processor has made no progress on its call for %.0f s: not live, the "
                    "pod restarts (its inputs are uncommitted and are read again by the next "
                    "owner)",
                    held,
                )
            if said and state.processing_since is None:
                log.warning("the processor is through the call that held it; deciding again")
                said = 0

    # ------------------------------------------------------------------ time

    async def _tick_loop(self) -> None:
        interval = self.settings.join.sweep_interval_ms / 1000.0
        # watched as the ticker is: a probe gone left broker_ok as it was (ready, broker or not)
        prober = self._background(
            self.probe.run(self.clients.consumer, self._stopping), "sidecar-broker-probe"
        )
        try:
            await self._ticks(interval)
        finally:
            if not prober.done():  # one that ended was said fatal
                error = await cancel_and_wait(prober)
                if error is not None:
                    log.error("the %s task ended", prober.get_name(), exc_info=error)

    async def _ticks(self, interval: float) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            self.consumer_watch.check(getattr(self.subscriber, "tasks", None))
            try:
                await self.align()
                wall = _monotonic_ms()
                step = await self._in_worker(
                    self.processor.on_tick, self.intake.clock.read(wall), wall
                )
                await self.publisher.emit(step)
                await self.commit()
                await self.publisher.refresh_limits()
            except KafkaError as exc:
                log.warning("tick: %s (will retry)", exc)
            except Exception:  # a bug: said (one traceback per 10 s), and the next tick retries
                log.exception("tick failed (will retry)", extra=PER_INPUT)
            report_repeats(logging.getLogger().handlers)  # a flood of client lines that ended


def _say_windows_moved(held: HeldPartitions, waiting: int = 0) -> None:
    if said := _windows_moved(held, waiting):
        log.info("coverage windows follow the partitions: %s", said)


def _windows_moved(held: HeldPartitions, waiting: int = 0) -> str:
    """What an assignment did to the coverage windows, for the log ("" for nothing);
    ``waiting``: labels read back that wait for their requests."""
    said = []
    if held.refilled or held.labels or held.labels_unmatched:
        left = held.labels_unmatched - waiting
        said.append(
            f"{held.refilled} request(s) and {held.labels} label(s) of {list(held.new)} counted"
            + (f", {waiting} label(s) wait for their requests" if waiting else "")
            + (f" ({left} label(s) of requests not known here left out)" if left else "")
        )
    if held.dropped or held.labels_dropped:
        said.append(
            f"{held.dropped} request(s) and {held.labels_dropped} label(s) of "
            f"{list(held.gone)} dropped (read elsewhere now)"
        )
    return "; ".join(said)
