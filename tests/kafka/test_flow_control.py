"""Catching up on a backlog: the join store holds whole requests, not half-requests.

A pre-filled backlog (the sidecar was down while the LLM service kept writing)
is drained by a sidecar with a small join store. Without input alignment the
consumer reads ahead on one input topic and the store evicts half-requests by
capacity as ``incomplete`` although their other half is in Kafka; with it
(``kafka.align_inputs``, the default) every request gets its full verdict.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory
from tests.kafka.harness import incomplete_count, read_verdicts, wait_until

pytestmark = pytest.mark.connected

REQUESTS = 1500
STORE = 300  # open requests the join may hold: a fifth of the backlog ...
POLL = 50  # ... and several consumed batches (the production ratio: 10,000 vs 500)


async def _prefill(
    settings: Settings,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    *,
    poison: bool = False,
) -> None:
    """REQUESTS requests, each written as the service would: retrieval, then the answer;
    ``poison``: first, one junk record a generation partition, stamped 59 minutes ahead."""
    t = settings.topics
    padding = "Background text of a retrieved chunk. " * 40  # retrievals outweigh answers
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, linger_ms=5)
    await producer.start()
    try:
        if poison:
            ahead = int(time.time() * 1000) + 59 * 60_000  # Kafka 4 accepts up to an hour
            for p in range(3):
                await producer.send(t.generation, b"junk", partition=p, timestamp_ms=ahead)
        for i in range(REQUESTS):
            rid = f"req-{i}"
            hits = [
                {"chunk_id": f"c{j}", "doc_id": "d", "score": 0.7 - j / 10, "text": padding}
                for j in range(3)
            ]
            retrieval = retrieval_event(rid, hits=hits, k=3)
            await producer.send(t.retrieval, orjson.dumps(retrieval), key=rid.encode())
            await producer.send(t.generation, orjson.dumps(final_event(rid)), key=rid.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def _drain(
    kafka_broker: LocalKafka,
    topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    *,
    align: bool,
    poison: bool = False,
) -> tuple[list[dict[str, Any]], SidecarService]:
    settings = Settings.load(
        kafka={
            "bootstrap_servers": kafka_broker.bootstrap_servers,
            "group_id": topics["group"],
            "align_inputs": align,
            "max_poll_records": POLL,
        },
        topics={**{k: v for k, v in topics.items() if k != "group"}, "partitions": 3},
        join={"max_entries": STORE, "ttl_ms": 120_000, "sweep_interval_ms": 100},
        http={"enabled": False},
    )
    await create_topics(settings)
    await _prefill(settings, retrieval_event, final_event, poison=poison)
    service = SidecarService(settings, Processor(settings, PlaceholderPolicy()))
    await service.start()
    try:
        await wait_until(lambda: service.ready, 30, "partition assignment")
        verdicts = await read_verdicts(settings, REQUESTS, timeout_s=120)
    finally:
        await service.stop()
    return verdicts, service


@pytest.mark.parametrize("poison", [False, True], ids=["clean", "junk-from-the-future"])
async def test_backlog_drains_with_whole_requests_when_inputs_are_aligned(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    poison: bool,
) -> None:
    """``junk-from-the-future``: one undecodable record a generation partition, stamped 59
    minutes ahead, made generation "ahead" for the whole drain: 965-976 of the 1,500
    requests came out incomplete (helper-15). It costs itself now (a dead letter)."""
    verdicts, service = await _drain(
        kafka_broker, unique_topics, retrieval_event, final_event, align=True, poison=poison
    )
    expected = sorted(f"req-{i}" for i in range(REQUESTS))
    assert sorted(v["request_id"] for v in verdicts) == expected  # one each, none twice
    assert incomplete_count(verdicts) == 0
    assert service.processor.store.evictions == 0
    assert service.aligner is not None
    assert service.aligner.pauses > 0  # the aligner did the work, not luck
    assert service.aligner.paused == frozenset()  # nothing stays paused after the drain


async def test_without_alignment_the_same_backlog_loses_half_requests_to_capacity(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The control: the test above would fail without the aligner."""
    verdicts, service = await _drain(
        kafka_broker, unique_topics, retrieval_event, final_event, align=False
    )
    assert len({v["request_id"] for v in verdicts}) == REQUESTS  # still no request without one
    assert service.processor.store.evictions > STORE
    assert incomplete_count(verdicts) > REQUESTS // 10
    assert service.aligner is None
