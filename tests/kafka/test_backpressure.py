"""A slow claim verifier under a burst: the sidecar serves slower but decides every request.

A burst of requests is already in Kafka (every retrieval written before the
answers, as a busy LLM service writes them) when a sidecar starts whose claim
verifier takes a while per claim. The work queue fills, the consumer pauses its
partitions until it drains, and the join's TTL is not charged for the time the
sidecar itself was behind: every request gets its real decision, none
``incomplete``, and the pause counter shows the backpressure at work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from sidecar.config import Settings
from sidecar.contracts.events import (
    ClaimLabel,
    ClaimsSignal,
    RetrievalEvent,
    RetrievalSignal,
    SignalStatus,
)
from sidecar.kafka.app import SidecarService
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import ClaimResult, SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import incomplete_count, read_verdicts, wait_until

pytestmark = pytest.mark.connected

REQUESTS = 60
SENTENCES = ("The tower is in Paris.", " It opened in 1889.", " It is made of iron.")
CLAIM_S = 0.025  # per claim: ~4.5 s of verifying for the burst, against a 1 s join TTL
TTL_MS = 1_000


@dataclass
class SlowSession:
    """One sentence, one claim, ``CLAIM_S`` of work each (a verifier slower than the input)."""

    results: list[ClaimResult] = field(default_factory=list)
    held_bytes: int = 0
    _text: str = ""

    def feed(self, text: str) -> list[ClaimResult]:
        self._text += text
        done = self._text.count(".")
        return [self._verify(i) for i in range(len(self.results), done)]

    def finish(self, answer: str) -> tuple[list[ClaimResult], ClaimsSignal]:
        self._text = answer
        tail = [self._verify(i) for i in range(len(self.results), answer.count("."))]
        n = len(self.results)
        summary = ClaimsSignal(status=SignalStatus.OK, n=n, supported=n, reliability=1.0)
        return tail, summary

    def _verify(self, index: int) -> ClaimResult:
        time.sleep(CLAIM_S)
        result = ClaimResult(index, (0, 1), f"claim {index}", ClaimLabel.SUPPORTED, 0.9)
        self.results.append(result)
        return result


@dataclass(frozen=True)
class SlowChecker:
    version: str = "slow/1"

    def open(self, retrieval: RetrievalEvent, certification: RetrievalSignal) -> SlowSession:
        del retrieval, certification
        return SlowSession()


def _settings(broker: LocalKafka, topics: dict[str, str], **kafka: Any) -> Settings:
    return Settings.load(
        kafka={
            "bootstrap_servers": broker.bootstrap_servers,
            "group_id": topics["group"],
            "max_poll_records": 20,
            "max_queued_records": 40,  # two polls: the burst (300 records) must pause intake
            **kafka,
        },
        topics={k: v for k, v in topics.items() if k != "group"},
        join={"ttl_ms": TTL_MS, "sweep_interval_ms": 50},
        http={"enabled": False},
    )


async def _burst(
    settings: Settings, retrieval_event: EventFactory, final_event: EventFactory, pad: int = 0
) -> None:
    """Every retrieval first, then every answer (deltas, final): all in Kafka before the start.

    ``pad``: characters of filler (no sentence end) before each delta (large records).
    """
    t = settings.topics
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, linger_ms=5)
    await producer.start()
    try:
        for i in range(REQUESTS):
            rid = f"req-{i}"
            await producer.send(t.retrieval, dumps(retrieval_event(rid)), key=rid.encode())
        for i in range(REQUESTS):
            rid, key = f"req-{i}", f"req-{i}".encode()
            for seq, text in enumerate(SENTENCES):
                delta = {
                    "schema_version": 1,
                    "event_type": "generation.delta",
                    "request_id": rid,
                    "seq": seq,
                    "text": "x " * (pad // 2) + text,
                }
                await producer.send(t.generation, orjson.dumps(delta), key=key)
            answer = "".join(SENTENCES)
            await producer.send(t.generation, dumps(final_event(rid, answer=answer)), key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def _drain(
    broker: LocalKafka,
    topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    pad: int = 0,
    **kafka: Any,
) -> tuple[list[dict[str, Any]], SidecarService]:
    settings = _settings(broker, topics, **kafka)
    await create_topics(settings)
    await _burst(settings, retrieval_event, final_event, pad)
    processor = Processor(settings, PlaceholderPolicy(), signals=SignalSuite(claims=SlowChecker()))
    service = SidecarService(settings, processor)
    await service.start()
    try:
        await wait_until(lambda: service.ready, 30, "partition assignment")
        verdicts = await read_verdicts(settings, REQUESTS, timeout_s=90, linger_s=0.5)
    finally:
        await service.stop()
    return verdicts, service


async def test_a_slow_verifier_decides_every_request_of_a_burst(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    verdicts, service = await _drain(kafka_broker, unique_topics, retrieval_event, final_event)
    assert incomplete_count(verdicts) == 0, f"{incomplete_count(verdicts)} of {REQUESTS} incomplete"
    assert sorted(v["request_id"] for v in verdicts) == sorted(f"req-{i}" for i in range(REQUESTS))
    assert all(v["signals"]["claims"]["status"] == "ok" for v in verdicts)
    assert service.processor.counters.claim_verdicts == REQUESTS * len(SENTENCES)
    assert service.backpressure.pauses > 0  # the queue filled and intake stopped, not luck
    assert not service.backpressure.paused  # and resumed once it drained
    assert service.intake.clock.held_ms > TTL_MS  # the TTL was not charged for that time


async def test_large_records_pause_intake_by_bytes_not_only_by_count(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Deltas of ~20 KB: the record depth (a million) never pauses intake, the byte bound
    (1 MiB, about 50 of them) does, and every request is still decided."""
    verdicts, service = await _drain(
        kafka_broker,
        unique_topics,
        retrieval_event,
        final_event,
        pad=20_000,
        max_queued_records=1_000_000,
        max_queued_bytes=1_048_576,
    )
    assert incomplete_count(verdicts) == 0, f"{incomplete_count(verdicts)} of {REQUESTS} incomplete"
    assert sorted(v["request_id"] for v in verdicts) == sorted(f"req-{i}" for i in range(REQUESTS))
    assert service.backpressure.pauses > 0  # paused by bytes: the count is far from its depth
    assert not service.backpressure.paused
    assert (service.queue.records, service.queue.bytes) == (0, 0)


async def test_a_rebalance_while_intake_is_paused_leaves_no_partition_paused(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Audit: a replica paused by a full queue when a second one joined dropped its queue to
    the revocation, kept the pause, and put it on the partitions it got back: nothing came
    in to lift it, its partitions were never read again, and it stayed ready. The second
    replica joins while the first is paused: every request is still decided."""
    settings = _settings(kafka_broker, unique_topics)
    await create_topics(settings)
    await _burst(settings, retrieval_event, final_event)
    services = [
        SidecarService(
            settings,
            Processor(settings, PlaceholderPolicy(), signals=SignalSuite(claims=SlowChecker())),
        )
        for _ in range(2)
    ]
    first, second = services
    await first.start()
    try:
        await wait_until(lambda: first.backpressure.paused, 30, "the first replica pausing")
        await second.start()
        await wait_until(lambda: second.ready, 30, "the second replica's assignment")
        verdicts = await read_verdicts(settings, REQUESTS, timeout_s=90, linger_s=0.5)
        decided = {v["request_id"] for v in verdicts}
        assert decided == {f"req-{i}" for i in range(REQUESTS)}, (
            f"{REQUESTS - len(decided)} of {REQUESTS} never decided"
        )
        assert first.backpressure.pauses > 0
        await wait_until(lambda: not first.intake.paused, 10, "the first replica reading again")
    finally:
        for service in services:
            await service.stop()
