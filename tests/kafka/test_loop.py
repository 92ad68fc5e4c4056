"""The sidecar loop, written once and run twice: in memory and against real Kafka."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from sidecar.contracts.events import AnswerVerdict, DeadLetterRecord, Decision
from sidecar.localkafka.broker import LocalKafka
from sidecar.pipeline.processor import IDEMPOTENCY_HEADER
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import Harness, memory_harness, real_harness, settings_for


@pytest.fixture(params=["memory", pytest.param("connected", marks=pytest.mark.connected)])
async def harness(
    request: pytest.FixtureRequest, unique_topics: dict[str, str]
) -> AsyncIterator[Harness]:
    if request.param == "memory":
        async with memory_harness(settings_for(unique_topics)) as h:
            yield h
    else:
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        async with real_harness(settings_for(unique_topics, broker.bootstrap_servers)) as h:
            yield h


async def test_request_split_across_topics_is_joined(
    harness: Harness,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    t = harness.settings.topics
    await harness.publish(t.retrieval, dumps(retrieval_event("req-join")), b"req-join")
    await harness.publish(
        t.generation, dumps(delta_event("req-join", 0, "Frankenstein")), b"req-join"
    )
    await harness.publish(t.generation, dumps(final_event("req-join")), b"req-join")
    [msg] = await harness.collect(t.verdicts, 1)
    verdict = AnswerVerdict.model_validate(orjson.loads(msg.value))
    assert msg.key == b"req-join"
    assert verdict.request_id == "req-join"
    assert verdict.decision is Decision.CAVEAT
    assert msg.headers[IDEMPOTENCY_HEADER].decode() == verdict.idempotency_key


async def test_malformed_message_goes_to_the_dlq_and_the_loop_continues(
    harness: Harness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    t = harness.settings.topics
    broken = (
        b'{"schema_version": 1, "event_type": "generation.final", "request_id": "req-bad", "ans'
    )
    await harness.publish(t.generation, broken, b"req-bad", headers={"traceparent": "00-abc"})
    await harness.publish(t.retrieval, dumps(retrieval_event("req-ok")), b"req-ok")
    await harness.publish(t.generation, dumps(final_event("req-ok")), b"req-ok")
    [dead] = await harness.collect(t.dlq, 1)
    record = DeadLetterRecord.from_headers({k: v.decode() for k, v in dead.headers.items()})
    assert dead.value == broken
    assert dead.key == b"req-bad"
    assert record.reason == "malformed-json"
    assert record.source_topic == t.generation
    assert dead.headers["traceparent"] == b"00-abc"  # the original headers travel along
    [ok] = await harness.collect(t.verdicts, 1)
    assert AnswerVerdict.model_validate(orjson.loads(ok.value)).request_id == "req-ok"
    assert harness.service.processor.counters.dead_letters == 1


async def test_unknown_schema_version_is_dead_lettered_not_a_crash(
    harness: Harness, retrieval_event: EventFactory
) -> None:
    t = harness.settings.topics
    await harness.publish(
        t.retrieval, dumps(retrieval_event("req-v9", schema_version=9)), b"req-v9"
    )
    [dead] = await harness.collect(t.dlq, 1)
    assert dead.headers["x-dlq-reason"] == b"unknown-schema-version"
