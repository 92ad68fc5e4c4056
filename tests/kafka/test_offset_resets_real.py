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

import asyncio
import logging

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete

from sidecar.kafka import resets
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import real_harness, settings_for, wait_until
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


async def test_an_input_topic_deleted_and_created_again_under_traffic_is_read_from_its_start(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The platform team deletes an input topic under the running sidecar, traffic flowing,
    and creates it again. The broker drops the group's offsets with the topic; the sidecar
    retried its own commit of the old topic's offsets until one landed on the new topic
    (audit: the consumer then started there; where the new topic was already longer, its
    first records were skipped without a warning and the old handover marked some of the
    new finals finished: 2 of 400 requests had no verdict at all). A topic the group had
    dropped meanwhile was read again only at the consumer's next metadata refresh (5 min).
    Now the new topic is read from its start: every request gets a verdict, and those
    written once the topic was created again are whole."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers, topics={"partitions": 3})
    t = settings.topics
    bootstrap = kafka_broker.bootstrap_servers
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=60_000)
    sent_after: list[str] = []  # requests sent once the topic had been created again
    created = asyncio.Event()

    async def traffic(n: int) -> None:
        pending = []
        for i in range(n):
            rid = f"req-{i}"
            if created.is_set():
                sent_after.append(rid)
            pending.append(
                await producer.send(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            )
            await asyncio.sleep(0.025)
            pending.append(await producer.send(t.generation, dumps(final_event(rid)), rid.encode()))
            await asyncio.sleep(0.025)
        await asyncio.gather(*pending)

    with caplog.at_level(logging.WARNING, logger="sidecar.kafka"):
        async with real_harness(settings) as h:
            await producer.start()
            try:
                sender = asyncio.create_task(traffic(300))  # 15 s of requests
                await asyncio.sleep(2)
                admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
                await admin.start()
                try:
                    await admin.delete_topics([t.generation])
                    await wait_until(lambda: not h.service.state.topics_ok, 20, "the probe sees it")
                    await asyncio.sleep(6)  # the service's producer holds its finals meanwhile
                    await admin.create_topics([NewTopic(t.generation, 3, 1)])
                    created.set()
                finally:
                    await admin.close()
                await sender
            finally:
                await producer.stop()
            verdicts = answered(await h.collect(t.verdicts, 300, timeout_s=60))
    assert len(sent_after) > 100
    missing = sorted({f"req-{i}" for i in range(300)} - set(verdicts))
    assert not missing, missing  # a request whose final was deleted is answered incomplete
    torn = [rid for rid in sent_after if "incomplete" in {r.code for r in verdicts[rid].reasons}]
    assert not torn, torn
    said = [r.getMessage() for r in caplog.records]
    # the old topic's offsets were never committed to the new one (the consumer reset from
    # them when the new topic was still shorter, and skipped its records when it was not)
    assert not [m for m in said if "no longer in Kafka" in m and t.generation in m]
    assert any(f"{t.generation} deleted: what was read" in m for m in said), said
