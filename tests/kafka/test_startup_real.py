"""Start-up on the real broker: a backlog is read before the producer is ready.

FastStream's consumer starts polling inside ``broker.start()``; the producer is made,
sized to the output topics' ``max.message.bytes`` (an admin round trip) and started
after it. A backlog waiting in the input topics was read and judged in that window:
its outputs were queued in a producer not started yet, which start() then replaced by
a smaller one: stopping it waited for those records forever, and so did start() (two CI
runs hung 300 s). Now the processor takes the first batch once the producer is started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from aiokafka import AIOKafkaProducer

from sidecar.kafka.app import SidecarService
from sidecar.kafka.clients import AiokafkaProducerPort
from sidecar.kafka.intake import Records
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import real_harness, settings_for, wait_until
from tests.kafka.test_hostile_records import all_committed, answered

pytestmark = pytest.mark.connected

LIMITS_DELAY_S = 5.0  # longer than the group's first assignment takes on the local broker


async def test_a_backlog_read_before_the_producer_started_gets_its_verdicts_and_stop_returns(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the DLQ topic's limit is under the producer's batch size: the producer is remade smaller
    settings = settings_for(
        unique_topics, kafka_broker.bootstrap_servers, topics={"max_message_bytes": 65_536}
    )
    t = settings.topics
    ids = [f"req-s{i:02d}" for i in range(6)]
    await create_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for rid in ids:
            await producer.send_and_wait(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
            await producer.send_and_wait(t.generation, dumps(final_event(rid)), rid.encode())
    finally:
        await producer.stop()

    order: list[str] = []
    read_limits, handle = AiokafkaProducerPort.topic_limits, SidecarService._handle

    async def slow_limits(self: AiokafkaProducerPort, topics: Iterable[str]) -> dict[str, int]:
        await asyncio.sleep(LIMITS_DELAY_S)  # a slow admin round trip at start-up
        order.append("limits read")
        return await read_limits(self, topics)

    async def noted_handle(self: SidecarService, records: Records) -> None:
        order.append("records read")
        await handle(self, records)

    monkeypatch.setattr(AiokafkaProducerPort, "topic_limits", slow_limits)
    monkeypatch.setattr(SidecarService, "_handle", noted_handle)
    async with asyncio.timeout(90):  # start() waited forever: a failure, not a hang
        async with real_harness(settings) as h:
            verdicts = answered(await h.collect(t.verdicts, len(ids), timeout_s=30))
            assert sorted(verdicts) == ids
            await all_committed(h, settings, 2 * len(ids))
            await wait_until(lambda: h.service.publisher.in_flight == 0, 10, "confirmations")
            stopping = asyncio.create_task(h.service.stop())
            done, _ = await asyncio.wait({stopping}, timeout=15)
            assert done, "stop() did not return within 15 s"
            h.service.stop = _stopped  # type: ignore[method-assign]  # real_harness stops it again
    assert order.index("records read") < order.index("limits read"), order


async def _stopped() -> None:
    return None
