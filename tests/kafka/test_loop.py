"""The sidecar loop, written once and run twice: in memory and against real Kafka."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.contracts.events import AnswerVerdict, DeadLetterRecord, Decision
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.outputs import IDEMPOTENCY_HEADER
from sidecar.telemetry import Telemetry
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import Harness, memory_harness, real_harness, settings_for, wait_until


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(params=["memory", pytest.param("connected", marks=pytest.mark.connected)])
async def harness(
    request: pytest.FixtureRequest, unique_topics: dict[str, str], spans: InMemorySpanExporter
) -> AsyncIterator[Harness]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    telemetry = Telemetry(tracer=provider.get_tracer("test"))
    if request.param == "memory":
        async with memory_harness(settings_for(unique_topics), telemetry) as h:
            yield h
    else:
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        settings = settings_for(unique_topics, broker.bootstrap_servers)
        async with real_harness(settings, telemetry) as h:
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


async def test_each_record_read_is_pending_until_its_request_is_decided(
    harness: Harness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """Every record is its own pending input. In memory, FastStream gives every record
    offset 0: two requests' inputs were one pending offset, the first request decided
    finished the other's too, and a test that waited for "inputs finished" read the
    counters while the second verdict still waited for its confirmation (a full run on
    a loaded CPU counted 0 verdicts)."""
    t = harness.settings.topics
    tracker = harness.service.tracker
    rids = ["req-p1", "req-p2"]
    for rid in rids:
        await harness.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
    await wait_until(lambda: tracker.pending_count() == len(rids), 10, "both retrievals read")
    for rid in rids:
        await harness.publish(t.generation, dumps(final_event(rid)), rid.encode())
    assert len(await harness.collect(t.verdicts, len(rids))) == len(rids)
    await wait_until(lambda: tracker.pending_count() == 0, 10, "every input finished")


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


async def test_llm_service_span_is_the_parent_and_the_verdict_carries_the_context(
    harness: Harness,
    spans: InMemorySpanExporter,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    t = harness.settings.topics
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    llm_span = "00f067aa0ba902b7"
    parent = {"traceparent": f"00-{trace_id}-{llm_span}-01"}
    await harness.publish(t.retrieval, dumps(retrieval_event("req-tr")), b"req-tr", headers=parent)
    await harness.publish(t.generation, dumps(final_event("req-tr")), b"req-tr", headers=parent)
    [msg] = await harness.collect(t.verdicts, 1)
    # The request span ends once its verdict's send is confirmed, which can be just after
    # this consumer already read the verdict: wait for it (up to 10 s), never assume it.
    await wait_until(
        lambda: any(s.name == "guardrail.request" for s in spans.get_finished_spans()),
        10.0,
        "the request span",
    )
    finished = {s.name: s for s in spans.get_finished_spans()}
    root = finished["guardrail.request"]
    assert format(root.context.trace_id, "032x") == trace_id
    assert root.parent is not None and format(root.parent.span_id, "016x") == llm_span
    assert root.attributes is not None
    assert root.attributes["guardrail.request_id"] == "req-tr"
    assert root.attributes["guardrail.decision"] == "caveat"
    for stage in ("guardrail.join", "guardrail.certify", "guardrail.policy"):
        stage_parent = finished[stage].parent
        assert stage_parent is not None
        assert stage_parent.span_id == root.context.span_id, stage
    onward = msg.headers["traceparent"].decode()
    assert onward.split("-")[1] == trace_id
    # the verdict carries its PRODUCER span's context (a child of the request span)
    assert onward.split("-")[2] != format(root.context.span_id, "016x")
