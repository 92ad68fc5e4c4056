"""Input topics grown while the sidecar runs, on the real broker.

A team adds partitions to keep up (``kafka-topics --alter --partitions``). Before, the
sidecar marked itself not ready (but live, so nothing restarted it) and waited for
someone to restart the group, and its consumer found the new partitions only at its next
metadata refresh (5 minutes): requests keyed to them got no verdict meanwhile (helper-14:
171 of 450). Now the probe that sees the new counts has the consumer refresh its metadata,
the group rebalances onto them, and the replica stays ready.
"""

from __future__ import annotations

import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from guardrail_client.keys import partition_for
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory
from tests.kafka.harness import real_harness, settings_for, wait_until
from tests.kafka.test_hostile_records import answered, produce, requests

pytestmark = pytest.mark.connected


def keyed_to(partition: int, count: int, prefix: str, n: int) -> list[str]:
    """``n`` request ids that the default partitioner puts in ``partition`` of ``count``."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        rid = f"{prefix}-{i}"
        if partition_for(rid, count) == partition:
            out.append(rid)
        i += 1
    return out


async def test_grown_input_topics_are_read_without_a_restart(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers, topics={"partitions": 3})
    t = settings.topics
    async with real_harness(settings) as h:
        first = [f"req-a{i}" for i in range(6)]
        await produce(settings, requests(settings, first, retrieval_event, final_event))
        assert set(answered(await h.collect(t.verdicts, 6))) == set(first)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_partitions(
                {
                    name: NewPartitions(total_count=4)
                    for name in (t.retrieval, t.generation, t.feedback)
                }
            )
        finally:
            await admin.close()
        grown = time.monotonic()
        await wait_until(
            lambda: h.service.state.input_partitions.get(t.retrieval) == 4, 10, "probe"
        )
        new = keyed_to(3, 4, "req-new", 4)  # all in the new partition 3
        await produce(settings, requests(settings, new, retrieval_event, final_event))
        verdicts = answered(await h.collect(t.verdicts, 10, timeout_s=60))
        assert set(new) <= set(verdicts), sorted(set(new) - set(verdicts))
        assert time.monotonic() - grown < 60  # not the consumer's 5-minute metadata refresh
        assert all("incomplete" not in {r.code for r in verdicts[rid].reasons} for rid in new)
        await wait_until(lambda: h.service.ready, 30, "ready again")
        assert (t.retrieval, 3) in h.service.state.assigned
