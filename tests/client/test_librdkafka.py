"""A non-Python client proves the contracts: librdkafka (confluent-kafka) in, JSON Schema out.

The request's events are written by librdkafka from plain JSON built to
``schemas/`` (no pydantic, no project code), with ``partitioner=murmur2_random``
— librdkafka's default (``consistent_random``, CRC32) would put a key on another
partition than Java and aiokafka do. The verdict is read back by a librdkafka
consumer and validated with the ``jsonschema`` package against
``schemas/answer.verdict.schema.json``.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from typing import Any

import jsonschema
import pytest
from confluent_kafka import Consumer, Producer

from guardrail_client import partition_for
from sidecar.config import Settings
from tests.client.conftest import SidecarFactory
from tests.conftest import REPO

pytestmark = pytest.mark.connected

SCHEMAS = REPO / "schemas"


def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    return loaded


def produce(bootstrap: str, records: list[tuple[str, str, dict[str, Any]]]) -> list[int]:
    """Produce with librdkafka; returns the partition of each delivered record."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "acks": "all"}
    )
    partitions: list[int] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            partitions.append(msg.partition())

    for topic, key, event in records:
        producer.produce(topic, json.dumps(event).encode(), key.encode(), on_delivery=delivered)
    assert producer.flush(30) == 0 and errors == []
    return partitions


def consume_verdict(bootstrap: str, topic: str, key: str, timeout_s: float) -> Any:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"librdkafka-{key}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None and msg.key() == key.encode():
                return msg
    finally:
        consumer.close()
    raise TimeoutError(f"no verdict for {key} on {topic} within {timeout_s}s")


async def test_librdkafka_produces_a_request_and_reads_a_schema_valid_verdict(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    settings, t = client_settings, client_settings.topics
    bootstrap = settings.kafka.bootstrap_servers
    start_sidecar()
    rid = "rdkafka-request-7"
    retrieval = {
        "schema_version": 1,
        "event_type": "retrieval",
        "request_id": rid,
        "tenant": "acme",
        "collection": "wiki",
        "query": "who wrote frankenstein",
        "k": 1,
        "hits": [
            {"chunk_id": "c1", "doc_id": "d1", "score": 0.71, "text": "Mary Shelley wrote it."}
        ],
    }
    final = {
        "schema_version": 1,
        "event_type": "generation.final",
        "request_id": rid,
        "answer": "Frankenstein was written by Mary Shelley.",
        "generator_model": "some-llm",
    }
    jsonschema.validate(retrieval, schema("retrieval"))  # the producer side, checked the same way
    jsonschema.validate(final, schema("generation.final"))
    partitions = await asyncio.to_thread(
        produce, bootstrap, [(t.retrieval, rid, retrieval), (t.generation, rid, final)]
    )
    # murmur2_random puts the key where Java and aiokafka (guardrail_client) put it; the
    # librdkafka default (CRC32) would not, for this key
    expected = partition_for(rid, settings.topics.partitions)
    assert partitions == [expected] * 2
    assert zlib.crc32(rid.encode()) % settings.topics.partitions != expected
    msg = await asyncio.to_thread(consume_verdict, bootstrap, t.verdicts, rid, 60.0)
    verdict = json.loads(msg.value())
    jsonschema.validate(verdict, schema("answer.verdict"))
    assert verdict["request_id"] == rid and verdict["event_type"] == "answer.verdict"
    assert verdict["decision"] in ("allow", "caveat", "block")
    assert msg.partition() == partition_for(rid, settings.topics.partitions)
