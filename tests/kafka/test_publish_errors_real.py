"""Publish failures on the real broker: a topic that vanished, a verdict its topic refuses.

Bounds stated here: readiness goes false within the request timeout (the
producer's metadata wait) + ``PUBLISH_STALL_S`` + 5 s of slack, and the log
names the topic; a verdict too large for its topic is dead-lettered
(``output-too-large``) and the loop moves on.
"""

from __future__ import annotations

import logging

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.contracts.events import DeadLetterRecord
from sidecar.kafka.readiness import PUBLISH_STALL_S
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import real_harness, settings_for, wait_until

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


async def test_a_verdict_too_large_for_its_topic_goes_to_the_dlq(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:  # a verdict topic someone created with a tiny limit
        await admin.create_topics(
            [NewTopic(t.verdicts, 1, 1, topic_configs={"max.message.bytes": "256"})]
        )
    finally:
        await admin.close()
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
