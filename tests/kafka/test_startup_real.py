"""Start-up and shutdown on the real broker.

A backlog is read before the producer is ready:

FastStream's consumer starts polling inside ``broker.start()``; the producer is made,
sized to the output topics' ``max.message.bytes`` (an admin round trip) and started
after it. A backlog waiting in the input topics was read and judged in that window:
its outputs were queued in a producer not started yet, which start() then replaced by
a smaller one: their confirmations never came, and start() or stop() waited for them
forever (two CI runs hung 300 s). Now the processor takes the first batch once the
producer is started.

A confirmation that never comes: ``stop()`` waited for it without bound. Now it waits
half the grace period, leaves the step's inputs uncommitted, and goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import pytest

from sidecar.kafka.app import SidecarService
from sidecar.kafka.clients import AiokafkaProducerPort
from sidecar.kafka.intake import Records
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.pipeline.outputs import Output
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import committed, real_harness, settings_for, wait_until
from tests.kafka.test_hostile_records import all_committed, answered, produce, requests

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
    await produce(settings, requests(settings, ids, retrieval_event, final_event))

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
            stopping = time.monotonic()
        took = time.monotonic() - stopping  # real_harness stops the service, then its clients
    assert took < 15, f"stop() took {took:.1f} s"
    assert order.index("records read") < order.index("limits read"), order


async def test_stop_leaves_a_step_never_confirmed_uncommitted_within_half_the_grace(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers).model_copy(
        update={"shutdown_grace_ms": 2_000}
    )
    t = settings.topics
    caplog.set_level(logging.WARNING, logger="sidecar")
    async with asyncio.timeout(90):
        async with real_harness(settings) as h:
            never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            handed: list[Output] = []

            async def unconfirmed(out: Output) -> Any:
                handed.append(out)
                return never  # handed over; the broker never answers

            h.service.publisher.send_output = unconfirmed  # type: ignore[method-assign]
            await h.publish(t.retrieval, dumps(retrieval_event("req-x")), b"req-x")
            await h.publish(t.generation, dumps(final_event("req-x")), b"req-x")
            # the verdict's step: the retrieval's own step (nothing to confirm) is in flight
            # too, for one turn of the loop, and a poll that saw only it stopped the service
            # before the verdict was decided (a full run on a loaded CPU: no such line)
            await wait_until(
                lambda: bool(handed) and h.service.publisher.in_flight == 1,
                20,
                "the verdict's step in flight",
            )
            stopping = time.monotonic()
        took = time.monotonic() - stopping  # real_harness stops the service, then its clients
    assert took < 10, f"stop() took {took:.1f} s"  # the grace is 2 s; room for commit and close
    logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records]
    assert any("1 step(s) not confirmed within 1.0 s" in line for line in logged), logged
    assert h.service.publisher.in_flight == 0  # abandoned, not left running
    offsets = await committed(settings.kafka.bootstrap_servers, settings.kafka.group_id)
    assert sum(offsets.values()) == 0, offsets  # the request is read again by the next owner


async def test_a_bootstrap_list_of_several_servers_starts_and_serves(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """A production cluster's bootstrap list, ``b-1:9092,b-2:9092,b-3:9092``, with only one
    of them answering (the others down or restarting). FastStream took the string as one
    server (its list of one, which aiokafka does not split on commas) and every start failed
    with "Unable to bootstrap from [('127.0.0.1:1,127.0.0.1:2,127.0.0.1', 9092)]"."""
    down = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    servers = ", ".join([*down, kafka_broker.bootstrap_servers])  # spaces, as people write it
    settings = settings_for(unique_topics, servers)
    assert settings.kafka.servers == [*down, kafka_broker.bootstrap_servers]
    ids = [f"req-b{i:02d}" for i in range(4)]
    await create_topics(settings)
    await produce(settings, requests(settings, ids, retrieval_event, final_event))
    async with asyncio.timeout(90), real_harness(settings) as h:
        verdicts = answered(await h.collect(settings.topics.verdicts, len(ids), timeout_s=30))
        assert sorted(verdicts) == ids
