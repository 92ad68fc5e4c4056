"""Refused records near the message limit, into a real sidecar process on a real broker:
each costs its own record, and only until it is dead-lettered.

As measured before the fix: 300 retrievals of ~900 KB whose texts are over the schema's
100,000 characters took the process from 101.7 to 891.9 MB (each error's traceback kept
its record and batch in a cycle that only the cyclic collector freed, and the served
young-generation threshold let it wait); after it, 115 MB.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import retrieval
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from tests.kafka.harness import committed, read_settled, settings_for

pytestmark = pytest.mark.connected

RECORDS = 150
TEXT = 300_000  # characters in each of 3 hits: ~900 KB a record, under the 1 MiB limit


def _refused(i: int) -> tuple[bytes, bytes]:
    rid = f"big-{i}"
    event = retrieval(rid)
    for hit in event["hits"][:3]:
        hit["text"] = "p" * TEXT  # over the schema's 100,000 characters: schema-violation
    return rid.encode(), orjson.dumps(event)


async def test_refused_records_near_the_limit_do_not_pile_up(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    settings = settings_for(unique_topics, bootstrap)
    await create_topics(settings)
    env = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "GUARDRAIL_KAFKA__GROUP_ID": unique_topics["group"],
        **{f"GUARDRAIL_TOPICS__{k.upper()}": v for k, v in unique_topics.items() if k != "group"},
    }
    side = SidecarProcess(env, tmp_path / "sidecar.log")
    side.start()
    try:
        await asyncio.sleep(1.0)
        baseline = side.rss_mb()
        assert baseline is not None
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2**21)
        await producer.start()
        peak = baseline
        try:
            for i in range(RECORDS):
                key, value = _refused(i)
                await producer.send(settings.topics.retrieval, value, key=key)
                if i % 10 == 0:
                    peak = max(peak, side.rss_mb() or 0.0)
            await producer.flush()
        finally:
            await producer.stop()
        done = 0
        for _ in range(600):
            peak = max(peak, side.rss_mb() or 0.0)
            done = sum((await committed(bootstrap, unique_topics["group"])).values())
            if done >= RECORDS:
                break
            await asyncio.sleep(0.2)
        peak = max(peak, side.rss_mb() or 0.0)
        assert done == RECORDS, side.tail()
        dead = await read_settled(bootstrap, settings.topics.dlq)
        assert len(dead) == RECORDS
        assert {dict(r.headers)["x-dlq-reason"] for r in dead} == {b"schema-violation"}
        # ~135 MB of refused records went through; before the fix ~2.6 MB each stayed
        assert peak - baseline < 100.0, (baseline, peak)
    finally:
        assert side.signal(signal.SIGTERM) == 0, side.tail()
