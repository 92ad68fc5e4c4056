"""Publish failures on the real broker: a topic that vanished, a verdict its topic refuses.

Bounds stated here: readiness goes false within the request timeout (the
producer's metadata wait) + ``PUBLISH_STALL_S`` + 5 s of slack, and the log
names the topic; with the verdict topic deleted under traffic, within
``PUBLISH_STALL_S`` + 4 s at the default 30 s request timeout, and liveness
within the missing-topic time + 4 s of the probe finding the topic gone; a verdict
too large for its topic is dead-lettered (``output-too-large``) and the loop moves
on, also when the topic's limit was lowered after start (the broker's refusal
breaks aiokafka's idempotent producer on that partition: it is replaced);
verdicts that each fit their topic are never refused as a batch.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sidecar.contracts.events import DeadLetterRecord
from sidecar.kafka.clients import AiokafkaProducerPort
from sidecar.kafka.publish import request_size_bytes
from sidecar.kafka.readiness import PUBLISH_STALL_S
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.deadletters import record_size
from sidecar.pipeline.outputs import Destination
from sidecar.pipeline.ports import SignalSuite
from tests.conftest import EventFactory, dumps
from tests.fakes import ThresholdCertifier
from tests.kafka.harness import read_settled, real_harness, settings_for, wait_until
from tests.pipeline.test_signal_wiring import SentenceChecker

pytestmark = pytest.mark.connected

REQUEST_TIMEOUT_MS = 3_000


async def test_a_deleted_output_topic_makes_the_sidecar_unready_and_the_log_names_it(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        kafka={"request_timeout_ms": REQUEST_TIMEOUT_MS},
    )
    t = settings.topics
    caplog.set_level(logging.WARNING, logger="sidecar")
    async with real_harness(settings) as h:
        assert h.service.state.publishing
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.delete_topics([t.verdicts])
            # the broker applies a deletion after the controller accepted it: a verdict
            # produced in between is confirmed (a full CI run on a loaded CPU did so)
            async with asyncio.timeout(30):
                while t.verdicts in await admin.list_topics():
                    await asyncio.sleep(0.1)
        finally:
            await admin.close()
        await h.publish(t.retrieval, dumps(retrieval_event("req-lost")), b"req-lost")
        await h.publish(t.generation, dumps(final_event("req-lost")), b"req-lost")
        bound_s = REQUEST_TIMEOUT_MS / 1000 + PUBLISH_STALL_S + 5.0
        await wait_until(lambda: not h.service.state.publishing, bound_s, "readiness to drop")
        assert any(t.verdicts in r.getMessage() for r in caplog.records), [
            r.getMessage() for r in caplog.records
        ]
        assert h.service.tracker.pending_count() > 0  # nothing committed past the verdict


async def test_a_verdict_topic_deleted_under_traffic_is_unready_in_time_then_not_live(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The verdict topic deleted under 10 requests a second, at aiokafka's default request
    timeout (30 s): ``/readyz`` stayed 200 for 70 s (no failure reached the loop while
    aiokafka retried each record for 30 s, then the loop's own retry waited as long) and
    ``FATAL`` came after 91 s; aiokafka's sender asked for metadata ~2,700 times a second
    meanwhile. Now: not ready ``PUBLISH_STALL_S`` after the deletion, not live
    ``missing_topic_fatal_s`` after the probe found the topic gone (15 s here, for time; 30 s
    by default), metadata asked for at most ~10 times a second; once the topic is back,
    every request sent after the deletion gets its verdict."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    assert settings.kafka.request_timeout_ms == 30_000
    t = settings.topics
    caplog.set_level(logging.WARNING, logger="sidecar")
    async with real_harness(settings) as h:
        state = h.service.state
        client = h.service.clients.producer._producer.client  # type: ignore[attr-defined]
        asked = _count_metadata_requests(client)
        sent: list[tuple[str, float]] = []

        async def traffic() -> None:
            for i in itertools.count():
                rid = f"req-{i:04d}"
                await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
                await h.publish(t.generation, dumps(final_event(rid)), rid.encode())
                sent.append((rid, time.monotonic()))
                await asyncio.sleep(0.1)

        sending = asyncio.create_task(traffic())
        try:
            await h.collect(t.verdicts, 5, timeout_s=30)
            assert state.publishing
            await _delete(settings.kafka.bootstrap_servers, t.verdicts)
            deleted = time.monotonic()
            asked_before = asked[0]
            await wait_until(
                lambda: not state.publishing, PUBLISH_STALL_S + 4.0, "readiness to drop"
            )
            unready_s = time.monotonic() - deleted
            assert unready_s >= PUBLISH_STALL_S - 0.5, unready_s
            assert state.live
            # the missing time counts from the probe that found the topic gone (README): the
            # broker applies a deletion after the controller accepted it, and the probe asks
            # every 2 s; counted from the deletion, a loaded CPU took 19.1 s (4.1 s to find it)
            assert t.verdicts in state.outputs_missing, "the probe has not found it gone"
            found = state.outputs_missing[t.verdicts]
            state.missing_topic_fatal_s = 15.0
            await wait_until(
                lambda: not state.live, found + 15.0 + 4.0 - time.monotonic(), "liveness to drop"
            )
            fatal_s = time.monotonic() - deleted
            assert fatal_s >= 15.0 - 0.5, fatal_s
            rate = (asked[0] - asked_before) / fatal_s
            assert rate < 30, f"{rate:.0f} metadata requests a second"
        finally:
            sending.cancel()
        fatal = [r.getMessage() for r in caplog.records if "FATAL" in r.getMessage()]
        assert len(fatal) == 1 and t.verdicts in fatal[0], fatal
        await create_topics(settings)  # the operator puts it back: publishing resumes
        after = {rid for rid, at in sent if at > deleted + 0.5}
        # more than the publisher keeps in flight: some waited behind the retried ones (the
        # traffic's own pace is the CPU's: 78-99 requests, not 10 a second, on a loaded one)
        assert len(after) > settings.kafka.batches_in_flight, len(after)
        deadline = time.monotonic() + 60
        while True:
            verdicts = await read_settled(settings.kafka.bootstrap_servers, t.verdicts)
            missing = after - {(v.key or b"").decode() for v in verdicts}
            if not missing or time.monotonic() > deadline:
                break
        assert not missing, sorted(missing)


def _count_metadata_requests(client: Any) -> list[int]:
    """Count the metadata requests an aiokafka client sends (``[n]``, kept current)."""
    asked = [0]
    update = client._metadata_update

    async def counted(*args: Any) -> Any:
        asked[0] += 1
        return await update(*args)

    client._metadata_update = counted
    return asked


async def _delete(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def test_a_verdict_too_large_for_its_topic_goes_to_the_dlq(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    # a verdict topic someone created with a tiny limit
    await _create_topic(settings.kafka.bootstrap_servers, t.verdicts, 256)
    await create_topics(settings)
    async with real_harness(settings) as h:
        await h.publish(t.retrieval, dumps(retrieval_event("req-big")), b"req-big")
        await h.publish(t.generation, dumps(final_event("req-big")), b"req-big")
        [dead] = await h.collect(t.dlq, 1, timeout_s=30)
        record = DeadLetterRecord.from_headers(dead.headers)
        assert record.reason == "output-too-large"
        assert record.source_topic == t.verdicts
        assert h.service.state.publishing  # one record's problem, not the loop's
        await wait_until(lambda: h.service.tracker.pending_count() == 0, 20, "inputs finished")


async def test_a_limit_raised_by_the_operator_counts_without_a_restart(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The DLQ says ``output-too-large``, the operator raises the topic's
    max.message.bytes: the limits read at start were kept until a restart (a fleet
    withdrawal announced again went to the DLQ every time). An output over a limit now
    gets the limits read again on a later tick."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    await _create_topic(settings.kafka.bootstrap_servers, t.verdicts, 256)
    await create_topics(settings)
    async with real_harness(settings) as h:
        h.service.publisher.limits_refresh_s = 0.2

        async def request(rid: str) -> None:
            await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            await h.publish(t.generation, dumps(final_event(rid)), rid.encode())

        await request("req-before")
        [dead] = await h.collect(t.dlq, 1, timeout_s=30)
        assert DeadLetterRecord.from_headers(dead.headers).reason == "output-too-large"
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            raised = {"max.message.bytes": "1000000"}
            topic = ConfigResource(ConfigResourceType.TOPIC, t.verdicts, raised)
            await admin.alter_configs([topic])
        finally:
            await admin.close()
        publisher = h.service.publisher
        await wait_until(
            lambda: publisher.limits[Destination.VERDICTS] > 256, 20, "the limit read again"
        )
        await request("req-after")
        [verdict] = await h.collect(t.verdicts, 1, timeout_s=30)
        assert verdict.key == b"req-after"
        assert h.service.state.producer_resets == 1  # its batches were capped at 256 bytes


async def test_a_send_waiting_for_metadata_when_the_producer_is_replaced_returns(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The ticker replaces the producer when a topic's limit was raised; a send through the
    old one may be waiting for its topic's metadata then. Stopping the old producer left
    that wait pending for good: the processor task that sent held its lock, and the
    sidecar's stop waited on that lock for ever (stopped during the test above at random
    moments, it hung 2 times in ~360). The old producer is now stopped once its sends
    are through: the record goes out, and the confirmation comes."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    port = AiokafkaProducerPort(settings.kafka, request_size_bytes(t.max_message_bytes))
    await port.start()
    try:
        # no such topic yet: the send waits for its metadata (up to the request timeout)
        sending = asyncio.create_task(port.send(t.verdicts, b"verdict", b"req-1", []))
        await asyncio.sleep(0.5)
        assert not sending.done()
        await port.reset()
        await create_topics(settings)
        async with asyncio.timeout(settings.kafka.request_timeout_ms / 1000 - 1):
            confirmation = await sending
            metadata = await confirmation
        assert metadata.topic == t.verdicts
    finally:
        await port.stop()


async def _create_topic(bootstrap: str, topic: str, max_message_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": str(max_message_bytes)})]
        )
    finally:
        await admin.close()


async def test_claim_verdicts_that_each_fit_their_topic_are_not_refused_as_a_batch(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The broker checks ``max.message.bytes`` per record batch: with the producer's
    256 KiB batches, one answer's claim verdicts (~360 bytes each) on a 4 KiB topic went
    out in one batch and were refused together, and the producer then refused everything
    on that partition (``OutOfOrderSequenceNumber``: not live). Batches now stay within
    the smallest output topic's limit."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    limit = 4096
    await _create_topic(settings.kafka.bootstrap_servers, t.claims, limit)
    sentences = 12
    answer = " ".join(f"Mary Shelley wrote chapter {i} of the novel." for i in range(sentences))
    signals = SignalSuite(certifier=ThresholdCertifier(), claims=SentenceChecker())
    async with real_harness(settings, signals=signals) as h:
        # one claim first: with the claims topic's metadata known, handing the next
        # answer's claim verdicts over never waits, so they go out in one batch
        await h.publish(t.retrieval, dumps(retrieval_event("req-warm")), b"req-warm")
        await h.publish(t.generation, dumps(final_event("req-warm")), b"req-warm")
        await h.collect(t.verdicts, 1, timeout_s=30)
        await h.publish(t.retrieval, dumps(retrieval_event("req-many")), b"req-many")
        await h.publish(t.generation, dumps(final_event("req-many", answer=answer)), b"req-many")
        claims = await h.collect(t.claims, sentences + 1, timeout_s=60)
        verdicts = await h.collect(t.verdicts, 2, timeout_s=30)
        assert len(claims) == sentences + 1 and len(verdicts) == 2
        assert sum(len(c.value) for c in claims) > limit  # one batch could not hold them
        assert max(len(c.value) for c in claims) < limit
        assert h.received[t.dlq] == []
        assert h.service.state.live and h.service.state.producer_resets == 0


async def test_a_limit_lowered_after_start_costs_the_record_over_it_not_the_partition(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The limit read at start no longer holds: the broker refuses one verdict. It is
    dead-lettered; the verdicts after it, on the same partition, are published (before,
    every later one was refused as ``OutOfOrderSequenceNumber`` and the loop went not live).

    Sizes come from the request ids, which the verdict carries in its key and body: the
    first verdict's record (an upper bound of its batch) sets the new limit, a
    128-character id is ~240 bytes over it, 8-character ids are ~60 bytes under it.
    """
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    async with real_harness(settings) as h:

        async def request(rid: str) -> None:
            await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            await h.publish(t.generation, dumps(final_event(rid)), rid.encode())

        await request("req-first-" + "f" * 30)
        [first] = await h.collect(t.verdicts, 1, timeout_s=30)
        headers = [(k, v) for k, v in first.headers.items()]
        lowered = record_size(first.key, first.value, headers)  # an upper bound of its batch
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.alter_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC,
                        t.verdicts,
                        configs={"max.message.bytes": str(lowered)},
                    )
                ]
            )
        finally:
            await admin.close()
        big = "req-big-" + "b" * 120
        await request(big)
        after = [f"req-a{i:03d}" for i in range(5)]
        for rid in after:
            await request(rid)
        verdicts = await h.collect(t.verdicts, 6, timeout_s=60)
        letters = await h.collect(t.dlq, 1, timeout_s=30)
        assert len(letters) == 1, [
            (d.key, DeadLetterRecord.from_headers(d.headers).reason, len(d.value)) for d in letters
        ] + [lowered, [(v.key, len(v.value)) for v in verdicts]]
        [dead] = letters
        assert DeadLetterRecord.from_headers(dead.headers).reason == "output-too-large"
        assert dead.key == big.encode()
        assert sorted(v.key or b"" for v in verdicts[1:]) == [rid.encode() for rid in after]
        assert h.service.state.live and h.service.state.producer_resets >= 1
        await wait_until(lambda: h.service.tracker.pending_count() == 0, 20, "inputs finished")
