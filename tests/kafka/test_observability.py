"""Telemetry a dashboard can trust: scraped counters equal what was published, and a
verdict's trace follows the messaging conventions (in memory and on the real broker)."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import orjson
import pytest
from aiokafka import ConsumerRecord
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from sidecar.contracts.events import (
    AnswerVerdict,
    Decision,
    GenerationFinal,
    Reason,
    RetrievalEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.kafka.app import SidecarService
from sidecar.kafka.handover import Handover
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import ClaimResult, PolicyOutcome
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.telemetry import Telemetry
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import Harness, memory_harness, real_harness, settings_for


class MixPolicy:
    """Decides from the answer's first word; names the tenant as the risk profile.

    ``allow`` gives no reason besides the profile, ``caveat`` two, ``block`` one:
    a verdict counted once per reason would not add up to the verdicts published.
    """

    name = "mix/1"
    fingerprint = "mix/1@test"
    profile_names = ("acme", "globex")
    reasons: dict[Decision, tuple[str, ...]] = {  # noqa: RUF012 - read only
        Decision.ALLOW: (),
        Decision.CAVEAT: ("weak-retrieval", "claims-unsupported"),
        Decision.BLOCK: ("claims-unsupported",),
    }

    def decide(
        self,
        retrieval: RetrievalEvent,
        final: GenerationFinal,
        signals: Signals,
        *,
        claims: Sequence[ClaimResult] | None = None,
        confidence: float | None = None,
        confidence_status: SignalStatus = SignalStatus.NOT_CONFIGURED,
    ) -> PolicyOutcome:
        del signals, claims, confidence, confidence_status
        decision = Decision(final.answer.split()[0])
        profile = Reason(code=f"profile.{retrieval.tenant}", message="risk profile")
        return PolicyOutcome(
            decision=decision,
            reasons=[profile, *(Reason(code=c, message=c) for c in self.reasons[decision])],
        )

    def check_stream(
        self,
        retrieval: RetrievalEvent,
        claims: Sequence[ClaimResult],
        certification: RetrievalSignal | None = None,
    ) -> PolicyOutcome | None:
        del retrieval, claims, certification
        return None


@pytest.fixture
def scrape() -> Iterator[tuple[Telemetry, str]]:
    """A Telemetry whose meter is read by the real Prometheus exporter, served over HTTP."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield Telemetry(meter=provider.get_meter("test")), f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()
    thread.join(5)
    provider.shutdown()


def scraped(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value), from one Prometheus scrape."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _publish_count(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    return sum(
        value
        for labels, value in metrics.get("guardrail_stage_duration_seconds_count", [])
        if labels["stage"] == "publish"
    )


@pytest.mark.connected
async def test_scraped_counters_equal_the_published_mix(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    scrape: tuple[Telemetry, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    telemetry, url = scrape
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    mix = [("allow", "acme")] * 4 + [("caveat", "acme")] * 3 + [("block", "globex")] * 2
    expired = 2  # retrieval only: evicted at the TTL, answered block / incomplete
    async with real_harness(settings, telemetry, MixPolicy()) as h:
        t = settings.topics
        for i, (decision, tenant) in enumerate(mix):
            rid = f"req-{i}"
            await h.publish(t.retrieval, dumps(retrieval_event(rid, tenant=tenant)), rid.encode())
            answer = f"{decision} Frankenstein was written by Mary Shelley."
            await h.publish(t.generation, dumps(final_event(rid, answer=answer)), rid.encode())
        for i in range(expired):
            await h.publish(t.retrieval, dumps(retrieval_event(f"lone-{i}")), f"lone-{i}".encode())
        await h.publish(t.generation, b"{", b"broken")
        got = await h.collect(t.verdicts, len(mix) + expired, timeout_s=30)
        await h.collect(t.dlq, 1)
        # a verdict can be read before the sidecar's producer has its confirmation, which
        # is when the publish stage is recorded: give the last confirmations time to land
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while (
            loop.time() < deadline
            and _publish_count(await asyncio.to_thread(scraped, url)) < len(mix) + expired
        ):
            await asyncio.sleep(0.05)
    published = Counter(
        (v.decision.value, v.tenant if v.reasons[0].code.startswith("profile.") else "none")
        for v in (AnswerVerdict.model_validate(orjson.loads(m.value)) for m in got)
    )
    assert sum(published.values()) == len(mix) + expired
    metrics = scraped(url)
    verdicts = {
        (labels["decision"], labels["profile"], labels["stage"]): value
        for labels, value in metrics["guardrail_verdicts_total"]
    }
    # every decision under every profile has a series from the start: the rest read 0
    zeros = {
        (d, p, "final"): 0
        for d in ("allow", "caveat", "block")
        for p in (*MixPolicy.profile_names, "none")
    }
    assert verdicts == zeros | {
        ("allow", "acme", "final"): 4,
        ("caveat", "acme", "final"): 3,
        ("block", "globex", "final"): 2,
        ("block", "none", "final"): expired,
    }
    assert verdicts == zeros | {(d, p, "final"): n for (d, p), n in published.items()}
    # everything was decided: nothing waits, nothing is paused
    for gauge in ("queue_records", "queue_bytes", "consumer_paused_partitions"):
        assert [value for _, value in metrics[f"guardrail_{gauge}"]] == [0.0], gauge
    reasons = {
        (labels["reason"], labels["decision"]): value
        for labels, value in metrics["guardrail_verdict_reasons_total"]
    }
    assert reasons == {
        ("weak-retrieval", "caveat"): 3,
        ("claims-unsupported", "caveat"): 3,
        ("claims-unsupported", "block"): 2,
        ("incomplete", "block"): expired,
    }
    dead = {labels["reason"]: v for labels, v in metrics["guardrail_dead_letters_total"]}
    assert dead == {"malformed-json": 1}
    counts = {
        labels["stage"]: value
        for labels, value in metrics["guardrail_stage_duration_seconds_count"]
    }
    assert counts["policy"] == len(mix)
    assert counts["publish"] == len(mix) + expired
    # timed from the final event's Kafka timestamp: the expired requests had no final event
    assert counts["answer_to_verdict"] == len(mix)
    bounds = {
        float(labels["le"])
        for labels, _ in metrics["guardrail_stage_duration_seconds_bucket"]
        if labels["stage"] == "policy"
    }
    assert min(bounds) == pytest.approx(50e-6) and 5.0 in bounds
    [(_, evictions)] = metrics["guardrail_join_evictions_total"]
    assert evictions == expired


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


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


async def test_a_verdicts_trace_follows_the_messaging_conventions(
    harness: Harness,
    spans: InMemorySpanExporter,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    t = harness.settings.topics
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    sent_retrieval, sent_final = "00f067aa0ba902b7", "53995c3f42cd8ad8"
    await harness.publish(
        t.retrieval,
        dumps(retrieval_event("req-tr")),
        b"req-tr",
        headers={"traceparent": f"00-{trace_id}-{sent_retrieval}-01"},
    )
    await harness.publish(
        t.generation,
        dumps(final_event("req-tr")),
        b"req-tr",
        headers={"traceparent": f"00-{trace_id}-{sent_final}-01"},
    )
    [msg] = await harness.collect(t.verdicts, 1)
    producer = await _wait_for(spans, f"send {t.verdicts}")
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}

    consumers = [s for s in finished if s.kind is SpanKind.CONSUMER]
    # one poll may hold records of both topics: then the span names no destination (semconv)
    names = {f"process {t.retrieval}", f"process {t.generation}", "process"}
    assert {s.name for s in consumers} <= names
    linked: dict[str, dict[str, Any]] = {}
    for span in consumers:
        attributes = dict(span.attributes or {})
        assert attributes["messaging.system"] == "kafka"
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["messaging.consumer.group.name"] == harness.settings.kafka.group_id
        if span.name == "process":
            assert "messaging.destination.name" not in attributes
        else:
            assert attributes["messaging.destination.name"] in {t.retrieval, t.generation}
        for link in span.links:
            linked[_hex(link.context.span_id)] = dict(link.attributes or {})
    assert {sent_retrieval, sent_final} <= set(linked)  # each record's producer context
    assert linked[sent_final]["messaging.destination.name"] == t.generation
    assert linked[sent_final]["messaging.kafka.message.key"] == "req-tr"
    assert int(linked[sent_final]["messaging.kafka.offset"]) >= 0
    assert "messaging.destination.partition.id" in linked[sent_final]

    request = by_name["guardrail.request"]
    assert request.kind is SpanKind.INTERNAL
    assert format(request.context.trace_id, "032x") == trace_id
    assert request.parent is not None and _hex(request.parent.span_id) == sent_final
    consumer_ids = {s.context.span_id for s in consumers}
    assert {link.context.span_id for link in request.links} & consumer_ids
    attributes = dict(request.attributes or {})
    assert attributes["guardrail.request_id"] == "req-tr"
    assert attributes["guardrail.decision"] == "caveat"
    assert attributes["guardrail.stage"] == "final"
    for stage in ("guardrail.join", "guardrail.certify", "guardrail.policy"):
        parent = by_name[stage].parent
        assert parent is not None and parent.span_id == request.context.span_id, stage

    assert producer.kind is SpanKind.PRODUCER
    assert producer.parent is not None and producer.parent.span_id == request.context.span_id
    sent = dict(producer.attributes or {})
    assert sent["messaging.system"] == "kafka"
    assert sent["messaging.operation.type"] == "send"
    assert sent["messaging.destination.name"] == t.verdicts
    assert sent["messaging.kafka.message.key"] == "req-tr"
    onward = msg.headers["traceparent"].decode().split("-")
    assert onward[1] == trace_id
    assert onward[2] == _hex(producer.context.span_id)  # the PRODUCER span, not the request


async def _wait_for(spans: InMemorySpanExporter, name: str) -> ReadableSpan:
    """The verdict can be read before its confirmation ended the producer span."""
    for _ in range(200):
        found = [s for s in spans.get_finished_spans() if s.name == name]
        if found:
            return found[0]
        await asyncio.sleep(0.025)
    raise AssertionError(f"no finished span {name!r}")


@pytest.fixture(params=["memory", pytest.param("connected", marks=pytest.mark.connected)])
async def scraped_harness(
    request: pytest.FixtureRequest, unique_topics: dict[str, str], scrape: tuple[Telemetry, str]
) -> AsyncIterator[tuple[Harness, str]]:
    """A harness whose telemetry the real Prometheus exporter reads over HTTP."""
    telemetry, url = scrape
    if request.param == "memory":
        async with memory_harness(settings_for(unique_topics), telemetry) as h:
            yield h, url
    else:
        broker: LocalKafka = request.getfixturevalue("kafka_broker")
        settings = settings_for(unique_topics, broker.bootstrap_servers)
        async with real_harness(settings, telemetry) as h:
            yield h, url


def _consumed(
    metrics: dict[str, list[tuple[dict[str, str], float]]],
) -> dict[tuple[str, str], float]:
    return {
        (labels["topic"], labels["outcome"]): value
        for labels, value in metrics.get("guardrail_consumer_records_total", [])
    }


async def _until_counted(url: str, series: tuple[str, str], n: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while _consumed(await asyncio.to_thread(scraped, url)).get(series) != n:
        assert loop.time() < deadline, f"{series} never reached {n}"
        await asyncio.sleep(0.05)


async def test_consumed_records_are_counted_by_topic_and_outcome(
    scraped_harness: tuple[Harness, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """An on-call engineer reads intake per topic, and the share of it dead-lettered, from
    the sidecar's own metrics (before, only verdicts and dead letters were counted)."""
    h, url = scraped_harness
    t = h.settings.topics
    zeros = {
        (topic, outcome): 0.0
        for topic in (t.retrieval, t.generation, t.feedback)
        for outcome in ("accepted", "dead-lettered", "duplicate", "rerouted")
    }
    # every configured topic and outcome has a series from the start, and no other
    assert _consumed(await asyncio.to_thread(scraped, url)) == zeros
    for i in range(3):
        rid = f"req-{i}"
        await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
        await h.publish(t.generation, dumps(final_event(rid)), rid.encode())
    # an identical re-send of an open request's retrieval: a duplicate, not a new input.
    # Its final goes out once the re-send was read: on a real broker the generation topic
    # can be fetched ahead, and a re-send read after its request was decided is a new
    # record of a decided request (dead-lettered), not this case
    await h.publish(t.retrieval, dumps(retrieval_event("req-d")), b"req-d")
    await h.publish(t.retrieval, dumps(retrieval_event("req-d")), b"req-d")
    await _until_counted(url, (t.retrieval, "duplicate"), 1)
    await h.publish(t.generation, dumps(final_event("req-d")), b"req-d")
    label = {"schema_version": 1, "event_type": "feedback", "request_id": "req-0",
             "correct": True, "source": "user"}  # fmt: skip
    await h.publish(t.feedback, orjson.dumps(label), b"req-0")
    for topic in (t.retrieval, t.generation, t.feedback):  # one unreadable record each
        await h.publish(topic, b"{", b"broken")
    await h.collect(t.verdicts, 4)
    await h.collect(t.dlq, 3)
    expected = zeros | {
        (t.retrieval, "accepted"): 4,
        (t.retrieval, "duplicate"): 1,
        (t.retrieval, "dead-lettered"): 1,
        (t.generation, "accepted"): 4,
        (t.generation, "dead-lettered"): 1,
        (t.feedback, "accepted"): 1,
        (t.feedback, "dead-lettered"): 1,
    }
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while (got := await asyncio.to_thread(scraped, url)) and _consumed(got) != expected:
        if loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert _consumed(got) == expected
    # the ratio an alert reads: dead-lettered inputs are the dead letters counted apart
    dead = sum(v for labels, v in got["guardrail_dead_letters_total"])
    assert dead == sum(
        v for (_, outcome), v in _consumed(got).items() if outcome == "dead-lettered"
    )


def test_records_a_handover_skips_are_counted_as_duplicates(
    unique_topics: dict[str, str],
) -> None:
    """A retrieval or label its last owner finished never reaches the processor, and is
    consumed all the same: intake per topic must not read low after a rebalance."""
    settings = settings_for(unique_topics)
    t = settings.topics
    service = SidecarService(settings, Processor(settings, PlaceholderPolicy()))
    for topic in (t.retrieval, t.feedback):
        service.handovers[(topic, 0)] = Handover(start=0, horizon=3, pending=((1, 1),))
    records = [
        ConsumerRecord(topic, 0, offset, 0, 0, b"k", b"{}", None, 1, 2, ())
        for topic in (t.retrieval, t.feedback)
        for offset in range(4)
    ]
    kept = service._skip_finished(tuple(records))
    assert [(r.topic, r.offset) for r in kept] == [
        (topic, offset) for topic in (t.retrieval, t.feedback) for offset in (1, 3)
    ]
    consumed = service.consumed()
    assert consumed[(t.retrieval, "duplicate")] == 2
    assert consumed[(t.feedback, "duplicate")] == 2
    assert sum(consumed.values()) == 4  # the kept ones are counted when processed
