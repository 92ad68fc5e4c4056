"""A sloppy or hostile producer on the output topics, against a real broker: the client's
consumer outlives a header name that is not UTF-8 and a re-created topic, and a record keyed
with another request's id answers no one."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from guardrail_client import VerdictClient
from sidecar.config import Settings
from tests.conftest import REPO

pytestmark = pytest.mark.connected


def verdict(rid: str, decision: str = "block") -> bytes:
    return orjson.dumps({
        "request_id": rid, "idempotency_key": f"k-{rid}", "decision": decision, "reasons": [],
        "policy": "p@1", "produced_at": datetime.now(UTC).isoformat(), "sidecar_version": "t",
    })  # fmt: skip


def client(settings: Settings) -> VerdictClient:
    t = settings.topics
    return VerdictClient(
        settings.kafka.bootstrap_servers, verdicts_topic=t.verdicts, claims_topic=t.claims
    )


async def test_a_header_name_that_is_not_utf8_stops_no_caller_from_getting_its_verdict(
    client_settings: Settings, tmp_path: Path
) -> None:
    """Before the fix the record (for another request) ended the consumer task silently: the
    waiting caller fell back at its timeout, every later one at once, and stop() raised."""
    bootstrap, topic = client_settings.kafka.bootstrap_servers, client_settings.topics.verdicts
    value = tmp_path / "v.json"
    value.write_bytes(verdict("someone-else", "allow"))
    async with client(client_settings) as verdicts:
        waiting = asyncio.create_task(verdicts.verdict("mine", timeout=20))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.kafka.bad_header_name", bootstrap, topic,
            "someone-else", str(value), cwd=REPO, env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"},
        )  # fmt: skip
        assert await proc.wait() == 0
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, verdict("mine"), key=b"mine")
            result = await waiting
            assert (result.source, result.decision) == ("sidecar", "block")
            assert verdicts.running
        finally:
            await producer.stop()


async def test_a_verdict_written_to_a_recreated_topic_reaches_its_caller(
    client_settings: Settings,
) -> None:
    """Before the fix the client noticed the new topic only after aiokafka's 5-minute metadata
    age, and read it from "latest": a verdict written before that was lost."""
    bootstrap, topic = client_settings.kafka.bootstrap_servers, client_settings.topics.verdicts
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        async with client(client_settings) as verdicts:
            waiting = asyncio.create_task(verdicts.verdict("mine", timeout=40))
            await admin.delete_topics([topic])
            await asyncio.sleep(3)
            await admin.create_topics([NewTopic(topic, client_settings.topics.partitions, 1)])
            await asyncio.sleep(2)
            await producer.send_and_wait(topic, verdict("mine"), key=b"mine")
            result = await waiting
            assert result.source == "sidecar" and result.waited_s < 30
    finally:
        await producer.stop()
        await admin.close()
