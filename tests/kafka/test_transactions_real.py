"""Inputs written by a transactional producer, on the real broker.

A service that writes its retrieval and generation events in Kafka transactions (Kafka
Streams, Flink or Connect with exactly-once, or its own ``transactional_id``) aborts some:
those events never happened, and the sidecar reads committed records only
(``GUARDRAIL_KAFKA__ISOLATION_LEVEL=read_committed``, the default). Every transaction
leaves a marker after its records that no consumer is handed. Before: the consumer died
on the first abort marker (the lenient batch reader could not be read with ``next()``),
read_uncommitted judged aborted requests, and the marker counted as input the sidecar was
behind on, so the join clock stood still (no half-answered request ever expired) and the
committed offset stayed one short of the end (a lag of one per partition, for ever).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from guardrail_client.records import install_lenient_header_names
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import committed, end_offsets, real_harness, settings_for
from tests.kafka.test_hostile_records import answered

pytestmark = pytest.mark.connected

Records = list[tuple[str, str, bytes]]


async def _transactions(bootstrap: str, txn_id: str, work: list[tuple[Records, bool]]) -> None:
    """One transaction per ``(records, commit)``: committed, or aborted when ``commit`` is
    false."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn_id, enable_idempotence=True
    )
    await producer.start()
    try:
        for records, commit in work:
            await producer.begin_transaction()
            for topic, key, value in records:
                await producer.send_and_wait(topic, value, key=key.encode())
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


async def _committed_at(bootstrap: str, group: str, ends: dict[tuple[str, int], int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = await committed(bootstrap, group)
        if all(got.get(tp) == end for tp, end in ends.items()):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_aborted_transactions_are_not_judged_and_markers_cost_no_lag(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = settings_for(unique_topics, bootstrap, topics={"partitions": 1})
    t = settings.topics

    def pair(rid: str) -> Records:
        return [
            (t.retrieval, rid, dumps(retrieval_event(rid))),
            (t.generation, rid, dumps(final_event(rid))),
        ]

    # req-half's generation never comes: the join TTL (5 s here) must decide it
    half = [(t.retrieval, "req-half", dumps(retrieval_event("req-half")))]
    work = [(pair("req-committed"), True), (pair("req-aborted"), False), (half, True)]
    async with real_harness(settings) as h:
        await _transactions(bootstrap, f"txn-{unique_topics['group']}", work)
        verdicts = answered(await h.collect(t.verdicts, 2, timeout_s=30))
        assert set(verdicts) == {"req-committed", "req-half"}, sorted(verdicts)
        assert "incomplete" not in {r.code for r in verdicts["req-committed"].reasons}
        assert "incomplete" in {r.code for r in verdicts["req-half"].reasons}
        await h.collect(t.verdicts, 3, timeout_s=1)  # an aborted request's would come by now
        assert len(h.received[t.verdicts]) == 2
        assert not h.received[t.dlq], [m.headers for m in h.received[t.dlq]]
        assert h.service.state.live
        # the committed offsets reach the end of each partition, past the last marker
        ends = await end_offsets(bootstrap, [t.retrieval, t.generation], 1)
        assert await _committed_at(bootstrap, settings.kafka.group_id, ends), (
            ends,
            await committed(bootstrap, settings.kafka.group_id),
        )


async def test_a_read_committed_consumer_of_the_process_reads_past_abort_markers(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The lenient batch reader is installed for every aiokafka consumer of the process
    (``VerdictClient`` installs it in the LLM service's): one that reads committed records
    must still read them."""
    install_lenient_header_names()
    bootstrap = kafka_broker.bootstrap_servers
    await create_topics(settings_for(unique_topics, bootstrap, topics={"partitions": 1}))
    topic = unique_topics["verdicts"]
    work = [
        ([(topic, "a", b"committed-1")], True),
        ([(topic, "b", b"aborted")], False),
        ([(topic, "c", b"committed-2")], True),
    ]
    await _transactions(bootstrap, f"txn-{topic}", work)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            seen.extend(r.value for rs in batch.values() for r in rs if r.value is not None)
    finally:
        await consumer.stop()
    assert seen == [b"committed-1", b"committed-2"]
