"""Feedback in, coverage reports out, through the Kafka loop; and the offline topic reader.

The loop test is written once and run twice: on FastStream's in-memory broker
(ticks driven by the test) and on the real broker (the service's own ticker).
``read_topics`` is an aiokafka client with no in-memory twin: real broker only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from faststream.kafka import TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.events import (
    AnswerVerdict,
    CoverageReport,
)
from sidecar.kafka.app import SidecarService
from sidecar.kafka.read import read_topics
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps
from tests.fakes import ThresholdCertifier
from tests.kafka.harness import Msg, settings_for, wait_until

KEY = "acme/wiki"
REPORT_INTERVAL_S = 0.2


def topics_with_feedback(topics: dict[str, str]) -> dict[str, str]:
    suffix = topics["group"].removeprefix("g.")
    return {**topics, "feedback": f"t.{suffix}.feedback", "reports": f"t.{suffix}.reports"}


def coverage_processor(settings: Settings) -> tuple[Processor, CoverageMonitor]:
    monitor = CoverageMonitor(report_interval_s=REPORT_INTERVAL_S)
    suite = SignalSuite(certifier=ThresholdCertifier(calibration_key=KEY), coverage=monitor)
    return Processor(settings, PlaceholderPolicy(), signals=suite), monitor


class Loop:
    """The service with a coverage monitor, a way in and the outputs seen so far."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.processor, self.monitor = coverage_processor(settings)
        self.service = SidecarService(settings, self.processor)
        self.received: dict[str, list[Msg]] = defaultdict(list)
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.memory = False

    async def publish(self, topic: str, value: bytes, key: bytes) -> None:
        if self.producer is not None:
            await self.producer.send_and_wait(topic, value, key=key)
        else:
            await self.service.broker.publish(value, topic=topic, key=key)

    async def poll(self) -> None:
        """Fetch outputs (real broker) or drive one tick (in memory, no ticker runs)."""
        if self.consumer is not None:
            batch = await self.consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    self.received[r.topic].append(Msg(r.key, r.value, dict(r.headers)))
        else:
            await self.service.publisher.emit(self.processor.on_tick(time.monotonic() * 1000.0))
            await asyncio.sleep(0.05)

    async def collect(self, topic: str, n: int, timeout_s: float = 30.0) -> list[Msg]:
        deadline = time.monotonic() + timeout_s
        while len(self.received[topic]) < n and time.monotonic() < deadline:
            await self.poll()
        return list(self.received[topic])


async def _raw(message: Any) -> Any:
    return message.body


def _sink(into: list[Msg]) -> Any:
    async def on_output(body: Any, msg: KafkaMessage) -> None:
        del body
        r: ConsumerRecord[bytes, bytes] = msg.raw_message
        into.append(Msg(r.key, r.value, dict(r.headers)))

    return on_output


@asynccontextmanager
async def memory_loop(settings: Settings) -> AsyncIterator[Loop]:
    loop = Loop(settings)
    t = settings.topics
    for topic in (t.verdicts, t.dlq, t.reports):
        loop.service.broker.subscriber(topic, decoder=_raw)(_sink(loop.received[topic]))
    async with TestKafkaBroker(loop.service.broker):
        yield loop


@asynccontextmanager
async def real_loop(settings: Settings) -> AsyncIterator[Loop]:
    await create_topics(settings)
    loop = Loop(settings)
    t = settings.topics
    loop.producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    loop.consumer = AIOKafkaConsumer(
        t.verdicts,
        t.dlq,
        t.reports,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await loop.producer.start()
    await loop.consumer.start()
    await loop.service.start()
    try:
        await wait_until(lambda: loop.service.ready, 60, "partition assignment")
        yield loop
    finally:
        await loop.service.stop()
        await loop.producer.stop()
        await loop.consumer.stop()


@pytest.fixture(params=["memory", pytest.param("connected", marks=pytest.mark.connected)])
async def loop(
    request: pytest.FixtureRequest, unique_topics: dict[str, str]
) -> AsyncIterator[Loop]:
    topics = topics_with_feedback(unique_topics)
    if request.param == "memory":
        async with memory_loop(settings_for(topics)) as h:
            yield h
    else:
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        async with real_loop(settings_for(topics, broker.bootstrap_servers)) as h:
            yield h


def feedback(request_id: str, correct: bool) -> bytes:
    return dumps(
        {
            "schema_version": 1,
            "event_type": "feedback",
            "request_id": request_id,
            "correct": correct,
            "source": "grader",
        }
    )


def labelled(report: CoverageReport) -> int:
    return report.epsilon.trials + report.delta.trials


async def test_feedback_turns_into_a_coverage_report(
    loop: Loop, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    t = loop.settings.topics
    low = [{"chunk_id": "c9", "doc_id": "d9", "score": 0.1, "text": "unrelated"}]
    requests = {"req-a": True, "req-b": True, "req-c": True, "req-d": False}  # covered?
    for rid, covered in requests.items():
        retrieval = retrieval_event(rid) if covered else retrieval_event(rid, hits=low)
        await loop.publish(t.retrieval, dumps(retrieval), rid.encode())
        await loop.publish(t.generation, dumps(final_event(rid)), rid.encode())
    verdicts = await loop.collect(t.verdicts, len(requests))
    decided = [AnswerVerdict.model_validate(orjson.loads(m.value)) for m in verdicts]
    assert {(v.request_id, v.signals.retrieval.m1) for v in decided} == set(requests.items())

    # a covered right answer, a covered wrong one, an uncovered wrong one, and an unknown
    for rid, correct in (("req-a", True), ("req-b", False), ("req-d", False), ("req-zz", False)):
        await loop.publish(t.feedback, feedback(rid, correct), rid.encode())
    deadline = time.monotonic() + 30.0
    found: tuple[Msg, CoverageReport] | None = None
    while found is None and time.monotonic() < deadline:
        await loop.poll()
        parsed = [
            (m, CoverageReport.model_validate_json(m.value)) for m in loop.received[t.reports]
        ]
        found = next(((m, r) for m, r in parsed if labelled(r) == 3), None)
    assert found is not None, f"no coverage.report with 3 labels on {t.reports}"
    msg, report = found
    assert msg.key == KEY.encode()
    assert report.calibration_key == KEY
    assert report.window_requests == 4
    assert (report.coverage.successes, report.coverage.trials) == (3, 4)
    assert (report.epsilon.successes, report.epsilon.trials) == (1, 2)
    assert (report.delta.successes, report.delta.trials) == (1, 1)
    assert report.delta_source == "labelled-uncovered"
    assert (report.measured_hallucination.successes, report.measured_hallucination.trials) == (
        2,
        3,
    )
    assert report.bound == pytest.approx(0.75 * 0.5 + 0.25 * 1.0)
    assert report.status == "holds"
    counters = loop.processor.counters
    # req-zz's label waits for a request that never comes (unmatched when it leaves)
    assert (counters.feedback, counters.feedback_unmatched) == (4, 0)
    assert len(loop.processor.waiting_labels) == 1
    assert counters.reports >= 1 and counters.dead_letters == 0
    assert loop.received[t.dlq] == []


# ------------------------------------------------------------------ read_topics


async def _make_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(name, n, replication_factor=1) for name, n in partitions.items()]
        )
    finally:
        await admin.close()


@pytest.fixture
def reader_settings(kafka_broker: LocalKafka) -> Settings:
    return Settings.load(kafka={"bootstrap_servers": kafka_broker.bootstrap_servers})


@pytest.mark.connected
async def test_read_topics_reads_everything_once_in_partition_order(
    kafka_broker: LocalKafka, reader_settings: Settings
) -> None:
    suffix = uuid.uuid4().hex[:10]
    verdicts, feedback_topic = f"t.{suffix}.verdicts", f"t.{suffix}.feedback"
    await _make_topics(kafka_broker.bootstrap_servers, {verdicts: 3, feedback_topic: 1})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    await producer.start()
    sent: dict[str, list[bytes]] = defaultdict(list)
    try:
        for seq in range(30):
            partition = seq % 3
            value = f"{verdicts}|{partition}|{seq:03d}".encode()
            await producer.send_and_wait(verdicts, value, partition=partition)
            sent[verdicts].append(value)
        await producer.send_and_wait(verdicts, None, key=b"gone", partition=1)  # tombstone
        for seq in range(7):
            value = f"{feedback_topic}|0|{seq:03d}".encode()
            await producer.send_and_wait(feedback_topic, value, partition=0)
            sent[feedback_topic].append(value)
    finally:
        await producer.stop()

    records = await asyncio.wait_for(read_topics(reader_settings, [verdicts, feedback_topic]), 60)

    values = [v for _, v in records]
    assert sorted(values) == sorted(sent[verdicts] + sent[feedback_topic])  # each exactly once
    assert all(v.decode().startswith(topic + "|") for topic, v in records)
    by_partition: dict[tuple[str, str], list[str]] = defaultdict(list)
    for topic, value in records:
        _, part, position = value.decode().split("|")
        by_partition[(topic, part)].append(position)
    assert len(by_partition) == 4
    for seqs in by_partition.values():
        assert seqs == sorted(seqs)  # offset order within each partition

    # a second read sees the same records: nothing was committed, no group moved
    again = await asyncio.wait_for(read_topics(reader_settings, [verdicts, feedback_topic]), 60)
    assert sorted(again) == sorted(records)


@pytest.mark.connected
async def test_read_topics_of_empty_or_missing_topics_is_empty(
    kafka_broker: LocalKafka, reader_settings: Settings
) -> None:
    suffix = uuid.uuid4().hex[:10]
    empty, missing = f"t.{suffix}.empty", f"t.{suffix}.missing"
    await _make_topics(kafka_broker.bootstrap_servers, {empty: 2})
    assert await asyncio.wait_for(read_topics(reader_settings, [missing]), 60) == []
    assert await asyncio.wait_for(read_topics(reader_settings, [empty]), 60) == []
    assert await asyncio.wait_for(read_topics(reader_settings, [empty, missing]), 60) == []


@pytest.mark.connected
async def test_read_topics_starts_at_the_log_start_after_retention(
    kafka_broker: LocalKafka, reader_settings: Settings
) -> None:
    """Partition 0 lost every record to retention, partition 1 its first two: no hang."""
    suffix = uuid.uuid4().hex[:10]
    topic = f"t.{suffix}.verdicts"
    await _make_topics(kafka_broker.bootstrap_servers, {topic: 2})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for partition in (0, 1):
            for seq in range(3):
                await producer.send_and_wait(
                    topic, f"{partition}|{seq}".encode(), partition=partition
                )
    finally:
        await producer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_records(
            {
                TopicPartition(topic, 0): RecordsToDelete(3),
                TopicPartition(topic, 1): RecordsToDelete(2),
            }
        )
    finally:
        await admin.close()
    records = await asyncio.wait_for(read_topics(reader_settings, [topic]), 30)
    assert records == [(topic, b"1|2")]
