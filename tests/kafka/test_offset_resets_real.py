"""Input records deleted before the sidecar read them, on the real broker.

Retention or ``kafka-delete-records`` can remove records the group has not read yet
(a sidecar down for longer than the topic's retention, an operator's cleanup). aiokafka
then resets the position and said so at INFO only, hidden with its other INFO lines:
requests went without verdicts and nothing said why (helper-14: 39 of 800 requests had
no verdict and 121 an incomplete one, readiness 200, no warning, no metric). The sidecar
now logs a WARNING naming the partition and offset, and counts it
(``guardrail.kafka.offset_resets``).
"""

from __future__ import annotations

import logging

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from sidecar.kafka import resets
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory
from tests.kafka.harness import real_harness, settings_for
from tests.kafka.test_hostile_records import all_committed, answered, produce, requests

pytestmark = pytest.mark.connected


async def test_records_deleted_before_they_were_read_are_named_and_counted(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers, topics={"partitions": 1})
    await create_topics(settings)
    t = settings.topics
    first = [f"req-a{i}" for i in range(3)]
    await produce(settings, requests(settings, first, retrieval_event, final_event))
    async with real_harness(settings) as h:
        assert set(answered(await h.collect(t.verdicts, 3))) == set(first)
        await all_committed(h, settings, 6)
    # while it is down: three more requests, and the first two of them deleted
    later = [f"req-b{i}" for i in range(3)]
    await produce(settings, requests(settings, later, retrieval_event, final_event))
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_records(
            {TopicPartition(topic, 0): RecordsToDelete(5) for topic in (t.retrieval, t.generation)}
        )
    finally:
        await admin.close()
    watch = resets.installed()  # by a service started before (this process's first above)
    assert watch is not None
    before = watch.resets
    with caplog.at_level(logging.WARNING, logger="sidecar.kafka"):
        async with real_harness(settings) as h:
            verdicts = answered(await h.collect(t.verdicts, 4))
    assert set(verdicts) == {*first, "req-b2"}  # req-b0 and req-b1 are gone
    assert watch.resets - before == 2
    warned = [r.getMessage() for r in caplog.records if "no longer in Kafka" in r.getMessage()]
    assert len(warned) == 2
    assert any(t.retrieval in line and "offset 3" in line for line in warned), warned
    assert all("earliest" in line for line in warned)
