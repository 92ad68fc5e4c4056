"""One broker test, two brokers: FastStream's in-memory TestKafkaBroker and real Kafka."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faststream.kafka import TestKafkaBroker
from faststream.kafka.annotations import KafkaMessage

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.kafka.intake import Records
from sidecar.kafka.topics import create_topics
from sidecar.pipeline.ports import CertificateLedger, Policy, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.telemetry import Telemetry


@dataclass(frozen=True)
class Msg:
    key: bytes | None
    value: bytes
    headers: dict[str, bytes]


class Harness(Protocol):
    settings: Settings
    service: SidecarService

    async def publish(
        self, topic: str, value: bytes, key: bytes | None, headers: dict[str, str] | None = None
    ) -> None: ...

    async def collect(self, topic: str, n: int, timeout_s: float = 20.0) -> list[Msg]: ...


def settings_for(
    names: dict[str, str], bootstrap: str = "127.0.0.1:9092", **extra: Any
) -> Settings:
    """Test settings; ``kafka=`` / ``topics=`` / ``join=`` in ``extra`` add to (not replace)
    those sections."""
    return Settings.load(
        kafka={
            "bootstrap_servers": bootstrap,
            "group_id": names["group"],
            **extra.pop("kafka", {}),
        },
        topics={**{k: v for k, v in names.items() if k != "group"}, **extra.pop("topics", {})},
        join={"ttl_ms": 5000, "sweep_interval_ms": 100, **extra.pop("join", {})},
        http={"enabled": False},
        **extra,
    )


class MemoryHarness:
    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry | None = None,
        policy: Policy | None = None,
    ) -> None:
        self.settings = settings
        self.service = SidecarService(
            settings, Processor(settings, policy or PlaceholderPolicy()), telemetry=telemetry
        )
        self.received: dict[str, list[Msg]] = defaultdict(list)
        t = settings.topics
        for topic in (t.verdicts, t.claims, t.dlq):
            self._listen(topic)
        # FastStream's in-memory broker gives every record offset 0: numbered here as a
        # partition numbers them, or the offset tracker takes every request's inputs for one
        self._next_offset: dict[tuple[str, int], int] = defaultdict(int)
        handle = self.service._handle

        async def numbered(records: Records) -> None:
            await handle(tuple(self._numbered(r) for r in records))

        self.service._handle = numbered  # type: ignore[method-assign]

    def _numbered(self, record: ConsumerRecord[bytes, bytes]) -> ConsumerRecord[bytes, bytes]:
        tp = (record.topic, record.partition)
        offset, self._next_offset[tp] = self._next_offset[tp], self._next_offset[tp] + 1
        return dataclasses.replace(record, offset=offset)

    def _listen(self, topic: str) -> None:
        sink = self.received[topic]

        async def on_output(body: Any, msg: KafkaMessage) -> None:
            del body
            record: ConsumerRecord[bytes, bytes] = msg.raw_message
            sink.append(Msg(record.key, record.value, dict(record.headers)))

        self.service.broker.subscriber(topic, decoder=_raw)(on_output)

    async def publish(
        self, topic: str, value: bytes, key: bytes | None, headers: dict[str, str] | None = None
    ) -> None:
        await self.service.broker.publish(value, topic=topic, key=key, headers=headers)

    async def collect(self, topic: str, n: int, timeout_s: float = 20.0) -> list[Msg]:
        deadline = time.monotonic() + timeout_s
        while len(self.received[topic]) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return list(self.received[topic])


async def _raw(message: Any) -> Any:
    return message.body


class RealHarness:
    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry | None = None,
        policy: Policy | None = None,
        signals: SignalSuite | None = None,
        certificates: CertificateLedger | None = None,
    ) -> None:
        self.settings = settings
        processor = Processor(
            settings, policy or PlaceholderPolicy(), signals=signals, certificates=certificates
        )
        self.service = SidecarService(settings, processor, telemetry=telemetry)
        self.producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka.bootstrap_servers, acks="all"
        )
        t = settings.topics
        self.consumer = AIOKafkaConsumer(
            t.verdicts,
            t.claims,
            t.dlq,
            bootstrap_servers=settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        self.received: dict[str, list[Msg]] = defaultdict(list)

    async def publish(
        self, topic: str, value: bytes, key: bytes | None, headers: dict[str, str] | None = None
    ) -> None:
        hs = [(k, v.encode()) for k, v in (headers or {}).items()]
        await self.producer.send_and_wait(topic, value, key=key, headers=hs)

    async def collect(self, topic: str, n: int, timeout_s: float = 20.0) -> list[Msg]:
        deadline = time.monotonic() + timeout_s
        while len(self.received[topic]) < n and time.monotonic() < deadline:
            batch = await self.consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for r in records:
                    self.received[r.topic].append(Msg(r.key, r.value, dict(r.headers)))
        return list(self.received[topic])


async def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets (partitions without one left out)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {
        (tp.topic, tp.partition): meta.offset for tp, meta in offsets.items() if meta.offset >= 0
    }


async def end_offsets(
    bootstrap: str, topics: list[str], partitions: int
) -> dict[tuple[str, int], int]:
    """One past the last record of partitions ``0..partitions-1`` of every topic."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets(
            [TopicPartition(topic, p) for topic in topics for p in range(partitions)]
        )
    finally:
        await probe.stop()
    return {(tp.topic, tp.partition): off for tp, off in ends.items()}


async def wait_until(predicate: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def memory_harness(
    settings: Settings, telemetry: Telemetry | None = None, policy: Policy | None = None
) -> AsyncIterator[MemoryHarness]:
    h = MemoryHarness(settings, telemetry, policy)
    async with TestKafkaBroker(h.service.broker):
        yield h


@asynccontextmanager
async def real_harness(
    settings: Settings,
    telemetry: Telemetry | None = None,
    policy: Policy | None = None,
    signals: SignalSuite | None = None,
    certificates: CertificateLedger | None = None,
) -> AsyncIterator[RealHarness]:
    await create_topics(settings)
    h = RealHarness(settings, telemetry, policy, signals, certificates)
    await h.producer.start()
    await h.consumer.start()
    await h.service.start()
    try:
        await wait_until(lambda: h.service.ready, 30, "partition assignment")
        yield h
    finally:
        await h.service.stop()
        await h.producer.stop()
        await h.consumer.stop()


async def read_settled(
    bootstrap: str, topic: str, settle_s: float = 2.0
) -> list[ConsumerRecord[Any, Any]]:
    """Every record of ``topic`` (key, value, headers) once nothing new came for ``settle_s``."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    out: list[ConsumerRecord[Any, Any]] = []
    loop = asyncio.get_running_loop()
    quiet = loop.time()
    try:
        while loop.time() - quiet < settle_s:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                quiet = loop.time()
                out.extend(records)
    finally:
        await consumer.stop()
    return out


async def read_verdicts(
    settings: Settings, n: int, timeout_s: float, linger_s: float = 0.0
) -> list[dict[str, Any]]:
    """Verdicts until ``n`` distinct requests have one (an evicted request may get two);
    then ``linger_s`` more, for a second verdict that would come about then."""
    consumer = AIOKafkaConsumer(
        settings.topics.verdicts,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len({v["request_id"] for v in out}) < n:
                batch = await consumer.getmany(timeout_ms=200)
                out.extend(orjson.loads(r.value) for rs in batch.values() for r in rs)
        if linger_s > 0:
            await asyncio.sleep(linger_s)
            batch = await consumer.getmany(timeout_ms=200)
            out.extend(orjson.loads(r.value) for rs in batch.values() for r in rs)
    finally:
        await consumer.stop()
    return out


def incomplete_count(verdicts: list[dict[str, Any]]) -> int:
    """How many verdicts say ``incomplete`` (a join TTL or capacity eviction)."""
    return sum(any(r["code"] == "incomplete" for r in v["reasons"]) for v in verdicts)


async def cli(settings: Settings, *argv: str) -> tuple[int, str, str]:
    """``guardrail ARGV`` against ``settings``' brokers as a user runs it (its own event
    loop: a thread here): the exit code, stdout and stderr."""
    from sidecar.cli.main import main

    def run() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main([*argv, "--bootstrap-servers", settings.kafka.bootstrap_servers])
        return code, out.getvalue(), err.getvalue()

    return await asyncio.to_thread(run)
