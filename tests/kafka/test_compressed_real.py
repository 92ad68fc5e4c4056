"""Compressed input batches on the real broker, from librdkafka (every codec).

Input topics made by hand keep ``compression.type=producer``: the batches reach the
consumer compressed, and ``max.message.bytes`` counts their compressed bytes. Every codec
is read; a batch that inflates past ``GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES`` costs
its records from the first one not read whole (dead-lettered by one record naming their
offsets, ``batch-too-large``), never the sidecar's memory or the partition.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from confluent_kafka import Producer

from guardrail_client.records import install_lenient_header_names
from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import real_harness, settings_for
from tests.kafka.test_hostile_records import TOPIC_LIMIT, all_committed, answered

pytestmark = pytest.mark.connected

CODECS = ("gzip", "snappy", "lz4", "zstd")
BOMB = bytes(8 << 20)  # 8 MiB of zeros: a few KiB compressed, within TOPIC_LIMIT


async def hand_made_inputs(settings: Settings) -> None:
    """The input topics as a team makes them by hand: the broker keeps the producer's codec."""
    t = settings.topics
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        configs = {"compression.type": "producer", "max.message.bytes": str(TOPIC_LIMIT)}
        await admin.create_topics(
            [NewTopic(name, 1, 1, topic_configs=configs) for name in (t.retrieval, t.generation)]
        )
    finally:
        await admin.close()
    await create_topics(settings)  # the rest, as `guardrail topics create` makes them


def send(settings: Settings, codec: str, records: list[tuple[str, str, bytes]]) -> None:
    """(topic, key, value) in one batch per topic, compressed with ``codec``."""
    producer = Producer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "compression.type": codec,
            "linger.ms": 200,
            "batch.size": 64 << 20,
            "message.max.bytes": 256 << 20,  # the client's check counts uncompressed bytes
            "acks": "all",
        }
    )
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failed.append(str(error))

    for topic, key, value in records:
        producer.produce(topic, value, key.encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not failed, failed


async def test_every_codec_is_read_and_a_bomb_costs_its_batch_rest_not_memory(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        kafka={"max_batch_inflated_bytes": 1 << 20},
        topics={"max_message_bytes": TOPIC_LIMIT, "partitions": 1},
    )
    await hand_made_inputs(settings)
    t = settings.topics
    sent = 0
    for codec in CODECS:
        ids = [f"req-{codec}-{i}" for i in range(3)]
        await asyncio.to_thread(
            send, settings, codec,
            [(t.retrieval, rid, dumps(retrieval_event(rid))) for rid in ids]
            + [(t.generation, rid, dumps(final_event(rid))) for rid in ids],
        )  # fmt: skip
        sent += 6
    # one gzip batch: a final event, the bomb, another final event
    bomb_batch = [
        (t.generation, "req-before", dumps(final_event("req-before"))),
        (t.generation, "req-bomb", BOMB),
        (t.generation, "req-after", dumps(final_event("req-after"))),
    ]
    retrievals = [(t.retrieval, r, dumps(retrieval_event(r))) for r in ("req-before", "req-after")]
    await asyncio.to_thread(send, settings, "gzip", retrievals + bomb_batch)
    sent += 5

    async with real_harness(settings) as h:
        verdicts = answered(await h.collect(t.verdicts, 14, timeout_s=30))
        for codec in CODECS:
            for i in range(3):
                reasons = {r.code for r in verdicts[f"req-{codec}-{i}"].reasons}
                assert "incomplete" not in reasons, (codec, i)
        assert "incomplete" not in {r.code for r in verdicts["req-before"].reasons}
        # the bomb and what follows it in its batch: one dead letter naming the offsets
        assert "incomplete" in {r.code for r in verdicts["req-after"].reasons}
        [dead] = await h.collect(t.dlq, 1)
        assert dead.headers["x-dlq-reason"] == b"batch-too-large"
        detail = dead.headers["x-dlq-detail"].decode()
        first, last = map(int, re.search(r"offsets (\d+)\.\.(\d+) not read", detail).groups())  # type: ignore[union-attr]
        assert (first, last) == (13, 14)  # 12 finals of the codecs, req-before, then these
        assert "inflates past 1048576 bytes" in detail
        await all_committed(h, settings, sent)


async def test_a_poll_takes_at_most_max_poll_bytes_of_inflated_records(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The fetch limits count compressed bytes: one 128 KiB fetch of zstd batches held a
    gigabyte of records, all taken by one poll (a sidecar behind on such a backlog peaked
    at 1.2 GB RSS, 2.7 GB on a longer one). A poll now stops at ``max_poll_bytes`` (at
    least one record); the rest are read, in order, by the next polls."""
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        topics={"max_message_bytes": TOPIC_LIMIT, "partitions": 1},
    )
    await hand_made_inputs(settings)
    topic = settings.topics.generation
    values = [bytes([i]) * 100_000 for i in range(40)]  # 4 MB, a few KiB compressed
    await asyncio.to_thread(
        send, settings, "zstd", [(topic, f"k{i}", v) for i, v in enumerate(values)]
    )
    install_lenient_header_names(max_poll_bytes=250_000)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=131_072,
    )
    await consumer.start()
    polls: list[int] = []
    got: list[bytes] = []
    try:
        while len(got) < len(values):
            batch = await consumer.getmany(timeout_ms=5_000, max_records=500)
            assert batch, "no progress"
            records = [r for rs in batch.values() for r in rs]
            polls.append(len(records))
            got.extend(r.value or b"" for r in records)
    finally:
        await consumer.stop()
        install_lenient_header_names()
    assert got == values  # every record, in order
    assert max(polls) <= 3, polls  # 250,000 bytes: the third 100 KB record crosses it
    assert len(polls) >= 14, polls
