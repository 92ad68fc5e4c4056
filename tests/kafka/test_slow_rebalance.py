"""A rebalance while the processor is in a long batch (a throttled pod, claims on).

A replica holds every partition and works on a batch that takes longer than the
group's session timeout (a batch of answers with claims on takes seconds to minutes
on a slow CPU) when a second replica joins. The first can rejoin only once its batch
is through; the group must wait for it, and the requests of that batch must be
decided once, by it, whichever replica owns their partition afterwards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import final, retrieval
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy
from tests.kafka.harness import (
    committed,
    end_offsets,
    incomplete_count,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.connected

POLL = 8  # records a poll takes: the backlog is several batches
SESSION_TIMEOUT_MS = 6_000  # the test broker's group.min.session.timeout.ms
BATCH_S = 10.0  # each batch: longer than the session timeout once the second replica joins


class SlowProcessor(Processor):
    """A processor whose every non-empty batch takes ``BATCH_S`` (a CPU-throttled pod)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, PlaceholderPolicy())
        self.batch_started = threading.Event()

    def on_part(
        self, items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        if items and start == 0:  # one record's work that no part budget can split
            self.batch_started.set()
            time.sleep(BATCH_S)  # on the worker thread, as the verifier's work is
        return super().on_part(items, start, now_ms, budget_ns)


async def test_a_replica_joining_during_a_batch_longer_than_the_session_timeout(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """Audit: the group waited for a rejoin only as long as the session timeout (aiokafka's
    default rebalance timeout). The busy replica was dropped, the other took every partition,
    started a batch of its own, and was dropped in turn when the first rejoined: two
    replicas over 60 requests in 15 s batches decided none in 120 s (12 rebalances)."""
    ids, verdicts = await _join_during_a_batch(kafka_broker, unique_topics, requests=12, poll=8)
    decided = Counter(v["request_id"] for v in verdicts)
    assert set(decided) == set(ids), f"{len(set(ids) - set(decided))} of {len(ids)} never decided"
    assert incomplete_count(verdicts) == 0


async def _join_during_a_batch(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    *,
    requests: int,
    poll: int,
    rebalance_timeout_ms: int = 300_000,
) -> tuple[list[str], list[dict[str, Any]]]:
    """A backlog of ``requests`` whole requests; the second replica joins once the first has
    begun its first batch (of ``poll`` records). Returns the request ids and every verdict
    published once the group has committed them all (or given up)."""
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        kafka={
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "max_poll_records": poll,
            "max_queued_records": 2 * poll,
            "rebalance_timeout_ms": rebalance_timeout_ms,
        },
        join={"ttl_ms": 3_000},
    )
    await create_topics(settings)
    t = settings.topics
    ids = [f"req-{i}" for i in range(requests)]
    records = [Record(t.retrieval, rid.encode(), orjson.dumps(retrieval(rid))) for rid in ids]
    records += [
        Record(t.generation, rid.encode(), orjson.dumps(final(rid, "It is 42."))) for rid in ids
    ]
    assert await send(settings, records) == len(records)
    first, second = (SidecarService(settings, SlowProcessor(settings)) for _ in range(2))
    busy = first.processor
    assert isinstance(busy, SlowProcessor)
    await first.start()
    try:
        await wait_until(busy.batch_started.is_set, 30, "the first replica's first batch")
        await second.start()  # joins while that batch has ~BATCH_S to go
        await _until_committed(settings, timeout_s=6 * BATCH_S)
    finally:
        for service in (first, second):
            await service.stop()
    verdicts = await _all_verdicts(settings)
    return ids, verdicts


async def _until_committed(settings: Settings, timeout_s: float) -> None:
    """Until the group has committed every input record (everything decided and published),
    or ``timeout_s`` is over."""
    t = settings.topics
    bootstrap, group = settings.kafka.bootstrap_servers, settings.kafka.group_id
    ends = await end_offsets(bootstrap, [t.retrieval, t.generation], t.partitions)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = await committed(bootstrap, group)
        if all(done.get(tp) == end for tp, end in ends.items()):
            return
        await asyncio.sleep(0.5)


async def _all_verdicts(settings: Settings) -> list[dict[str, Any]]:
    """Every verdict on the verdict topic."""
    t = settings.topics
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await consumer.start()
    try:
        partitions = [TopicPartition(t.verdicts, p) for p in range(t.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        out: list[dict[str, Any]] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batch = await consumer.getmany(timeout_ms=200)
            out.extend(orjson.loads(r.value) for rs in batch.values() for r in rs)
    finally:
        await consumer.stop()
    return out


async def test_the_batch_in_hand_at_a_revocation_is_committed_not_decided_again(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The first replica's first batch holds every request whole, from every partition, when
    the second joins and takes some of them. Audit: the revocation committed before that
    batch was through, its verdicts went out after the commit, and the new owner decided
    those requests again (8 of 30 twice); the first replica re-read its own and worked
    through them once more."""
    ids, verdicts = await _join_during_a_batch(kafka_broker, unique_topics, requests=30, poll=500)
    decided = Counter(v["request_id"] for v in verdicts)
    assert set(decided) == set(ids), f"{len(set(ids) - set(decided))} of {len(ids)} never decided"
    twice = sorted(rid for rid, n in decided.items() if n > 1)
    assert not twice, f"{len(twice)} of {len(ids)} decided twice: {twice}"


async def test_a_batch_longer_than_the_rebalance_timeout_costs_second_verdicts_not_the_group(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """A batch may outlast any rebalance timeout (500 answers of 64 claim pairs on a throttled
    CPU). Waiting for it past the time the group waits for this member dropped the member, and
    the two replicas took the partitions from each other for good: the member waits for its
    batch in hand half that time, then leaves it out of the commit (its requests may be
    decided again by their new owner, under the same idempotency keys)."""
    ids, verdicts = await _join_during_a_batch(
        kafka_broker, unique_topics, requests=12, poll=8, rebalance_timeout_ms=SESSION_TIMEOUT_MS
    )
    decided = Counter(v["request_id"] for v in verdicts)
    assert set(decided) == set(ids), f"{len(set(ids) - set(decided))} of {len(ids)} never decided"
    assert incomplete_count(verdicts) == 0
    keys: dict[str, set[str]] = {}
    for v in verdicts:
        keys.setdefault(v["request_id"], set()).add(v["idempotency_key"])
    assert all(len(k) == 1 for k in keys.values())  # a second verdict repeats the first's key
