"""A backlog's batches are worked on in parts: a stop waits for the part in hand, and its
verdicts are out and committed; the rest of the batch is the next owner's, decided once.

Before: with claims on, a sidecar started on a backlog verified a whole poll (100 answers
of the bench's claim shape: 11-19 s with the shipped verifier, ``bench/batch_parts.py``)
before any of its verdicts went out, and a stop (a rolling update's SIGTERM) waited for
the whole batch: past the kubelet's grace it was killed, and the next owner decided the
batch again. Here a claim check of 50 ms a claim (0.15 s a request, 9 s for the
backlog of 60) and a stop as soon as the first verdicts are out, over one and two
partitions.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import SignalSuite
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory
from tests.kafka import test_backpressure
from tests.kafka.harness import committed, incomplete_count, read_verdicts, wait_until
from tests.kafka.test_backpressure import REQUESTS, SlowChecker, _burst

pytestmark = pytest.mark.connected

CLAIM_S = 0.05


def _settings(broker: LocalKafka, topics: dict[str, str], partitions: int, **join: int) -> Settings:
    return Settings.load(
        kafka={"bootstrap_servers": broker.bootstrap_servers, "group_id": topics["group"]},
        topics={**{k: v for k, v in topics.items() if k != "group"}, "partitions": partitions},
        join=join,
        http={"enabled": False},
    )


def _service(settings: Settings) -> SidecarService:
    processor = Processor(settings, PlaceholderPolicy(), signals=SignalSuite(claims=SlowChecker()))
    return SidecarService(settings, processor)


@pytest.mark.parametrize("partitions", [1, 2])
async def test_a_stop_during_a_backlog_batch_leaves_its_rest_to_the_next_owner_decided_once(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int,
) -> None:
    monkeypatch.setattr(test_backpressure, "CLAIM_S", CLAIM_S)
    settings = _settings(kafka_broker, unique_topics, partitions)
    await create_topics(settings)
    await _burst(settings, retrieval_event, final_event)  # 60 requests, 300 records
    first = _service(settings)
    await first.start()
    try:
        await wait_until(lambda: first.processor.counters.verdicts > 0, 30, "a first verdict")
        started = time.monotonic()
    finally:
        await first.stop()
    stop_s = time.monotonic() - started
    decided_first = first.processor.counters.verdicts
    # the stop did not wait for the backlog's batch: most of the 60 requests (9 s of
    # claims) are left, whatever the polls' sizes were
    assert decided_first < REQUESTS // 2, (decided_first, stop_s)
    group = await committed(kafka_broker.bootstrap_servers, unique_topics["group"])
    assert sum(group.values()) > 0  # the parts decided before the stop were committed

    second = _service(settings)
    await second.start()
    try:
        verdicts = await read_verdicts(settings, REQUESTS, timeout_s=90, linger_s=1.0)
    finally:
        await second.stop()
    per_request: Counter[str] = Counter(v["request_id"] for v in verdicts)
    assert set(per_request) == {f"req-{i}" for i in range(REQUESTS)}
    repeated = {rid: n for rid, n in per_request.items() if n > 1}
    assert not repeated, f"decided twice across a graceful stop: {repeated}"
    assert incomplete_count(verdicts) == 0
    assert second.processor.counters.verdicts == REQUESTS - decided_first


@pytest.mark.parametrize("partitions", [1, 2])
async def test_the_join_ttl_is_not_charged_for_the_parts_before_a_request_s_other_half(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int,
) -> None:
    """Every retrieval of the backlog is written before the answers, so a poll holds the
    retrievals and then the answers, each answer a part (its claims, 90 ms); a join TTL of
    1 s against ~5 s of parts between a request's halves. Audit: the ticks between parts
    swept the retrievals the parts had not reached the answers of yet: 50 of 60 requests
    ``incomplete`` (a whole batch read its join time once). The records a batch has left
    for later parts now hold the join clock, as queued records do."""
    monkeypatch.setattr(test_backpressure, "CLAIM_S", 0.03)
    settings = _settings(kafka_broker, unique_topics, partitions, ttl_ms=1000, sweep_interval_ms=50)
    await create_topics(settings)
    await _burst(settings, retrieval_event, final_event)
    service = _service(settings)
    await service.start()
    try:
        verdicts = await read_verdicts(settings, REQUESTS, timeout_s=90, linger_s=0.5)
    finally:
        await service.stop()
    assert {v["request_id"] for v in verdicts} == {f"req-{i}" for i in range(REQUESTS)}
    assert incomplete_count(verdicts) == 0, f"{incomplete_count(verdicts)} of {REQUESTS}"
    assert service.intake.clock.held_ms > 1_000  # held across parts, not luck
    assert service.intake.in_hand == 0
