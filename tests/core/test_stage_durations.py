"""Stage durations without the SDK's per-record path, and verdicts without spans.

* With Prometheus as the only metric reader, ``LocalStageDurations`` serves the
  histogram the SDK's Prometheus exporter served: the same lines on the page.
* Without a recording tracer, ``Telemetry(spans=False)`` opens no span and gives
  a verdict the headers the API's no-op tracer gave it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from opentelemetry.trace import NoOpTracer, NoOpTracerProvider, ProxyTracerProvider
from prometheus_client import CollectorRegistry, generate_latest

from sidecar import __version__
from sidecar.pipeline.outputs import AttributeValue, Destination, Output, TraceRecord
from sidecar.stage_durations import (
    DESCRIPTION,
    DURATION_BUCKETS_S,
    INSTRUMENT,
    SCOPE,
    LocalStageDurations,
    OtelStageDurations,
)
from sidecar.telemetry import Telemetry
from sidecar.telemetry_setup import TelemetrySetup, installed

STAGES = ("join", "certify", "score", "policy", "publish")
SCOPE_LABELS = {
    "otel_scope_name": SCOPE,
    "otel_scope_version": __version__,
    "otel_scope_schema_url": "",
}


def _stage_lines(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode("utf-8")
    return [line for line in text.splitlines() if "guardrail_stage_duration" in line]


def _pages(records: list[tuple[str, float]]) -> tuple[list[str], list[str]]:
    """The stage histogram's lines as the SDK's exporter writes them, and as ours does."""
    sdk_registry, local_registry = CollectorRegistry(), CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=sdk_registry)])
    histogram = provider.get_meter(SCOPE, __version__).create_histogram(
        INSTRUMENT,
        unit="s",
        description=DESCRIPTION,
        explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
    )
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION, scope=SCOPE_LABELS)
    local_registry.register(local)
    for stage, seconds in records:
        histogram.record(seconds, {"stage": stage})
        local.record(stage, seconds)
    try:
        return _stage_lines(sdk_registry), _stage_lines(local_registry)
    finally:
        provider.shutdown()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(STAGES),
            st.one_of(
                st.sampled_from(DURATION_BUCKETS_S),  # on a bound: that bucket (le)
                st.floats(min_value=0.0, max_value=10.0),
            ),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_the_page_shows_what_the_sdk_exporter_showed(records: list[tuple[str, float]]) -> None:
    sdk, ours = _pages(records)
    # HELP and TYPE once, then the samples; the exporter orders label rows by first record
    assert sdk[:2] == ours[:2]
    assert sorted(sdk[2:]) == sorted(ours[2:])
    assert len(ours) > 2


def test_buckets_are_cumulative_and_count_matches_inf() -> None:
    local = LocalStageDurations((0.001, 0.01), description="d")
    for seconds in (0.0005, 0.001, 0.002, 0.5, 7.0):
        local.record("join", seconds)
    (family,) = local.collect()
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("guardrail_stage_duration_seconds_bucket", "0.001")] == 2
    assert samples[("guardrail_stage_duration_seconds_bucket", "0.01")] == 3
    assert samples[("guardrail_stage_duration_seconds_bucket", "+Inf")] == 5
    assert samples[("guardrail_stage_duration_seconds_count", None)] == 5
    assert samples[("guardrail_stage_duration_seconds_sum", None)] == pytest.approx(7.5035)


@pytest.mark.parametrize("bounds", [(), (0.1, 0.1), (0.2, 0.1)])
def test_bounds_must_increase(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        LocalStageDurations(bounds, description="d")


TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PARENTS = {
    "traceparent": (("traceparent", TRACEPARENT),),
    "with tracestate and baggage": (
        ("traceparent", TRACEPARENT),
        ("tracestate", b"vendor=opaque"),
        ("baggage", b"tenant=acme"),
    ),
    "no context": (),
    "invalid traceparent": (("traceparent", b"00-zz-b7ad6b7169203331-01"),),
    "baggage only": (("baggage", b"tenant=acme"),),
}


def _verdict(parent: tuple[tuple[str, bytes], ...]) -> Output:
    stages = (("join", 10, 20), ("policy", 20, 30))
    attributes: dict[str, AttributeValue] = {"guardrail.decision": "allow"}
    record = TraceRecord("guardrail.request", parent, 0, 40, attributes, stages)
    headers = [("x-idempotency-key", b"k"), ("traceparent", b"stale")]
    return Output(Destination.VERDICTS, b"r", b"{}", headers, record)


@pytest.mark.parametrize("parent", PARENTS.values(), ids=PARENTS.keys())
def test_without_spans_a_verdict_gets_the_headers_the_noop_tracer_gave_it(
    parent: tuple[tuple[str, bytes], ...],
) -> None:
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    with_noop = Telemetry(tracer=NoOpTracer(), meter=meter)
    without = Telemetry(meter=meter, spans=False)
    outputs = []
    for telemetry in (with_noop, without):
        out = _verdict(parent)
        handle = telemetry.before_publish(out, "rag.verdicts")
        telemetry.after_publish(handle)
        outputs.append(out.headers)
    assert outputs[0] == outputs[1]


def test_without_spans_none_is_opened_but_verdicts_and_stages_are_counted() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("t")
    telemetry = Telemetry(tracer=provider.get_tracer("t"), meter=meter, spans=False)
    out = _verdict(PARENTS["traceparent"])
    with telemetry.consuming([], "g"):
        telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    dead = Output(Destination.DLQ, b"r", b"{}", [("x-dlq-reason", b"malformed-json")])
    telemetry.after_publish(telemetry.before_publish(dead, "rag.dlq"))
    assert exporter.get_finished_spans() == ()
    assert dict(out.headers)["traceparent"] == TRACEPARENT
    data = reader.get_metrics_data()
    assert data is not None
    got: dict[str, list[Any]] = {
        m.name: list(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    stages = {p.attributes["stage"]: p.count for p in got["guardrail.stage.duration"]}
    assert stages == {"join": 1, "policy": 1, "publish": 1}
    assert [p.value for p in got["guardrail.verdicts"]] == [1]
    assert [p.attributes["reason"] for p in got["guardrail.dead_letters"]] == ["malformed-json"]


class _CountingTracer:
    """The SDK's tracer, counting the spans it is asked to open."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.started = 0

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        self.started += 1
        return self.tracer.start_span(*args, **kwargs)


@pytest.mark.parametrize(("sampler", "exported"), [(ALWAYS_ON, 4), (ALWAYS_OFF, 0)])
def test_a_sampled_out_verdict_opens_only_its_request_span(sampler: Sampler, exported: int) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = _CountingTracer(provider.get_tracer("t"))
    telemetry = Telemetry(tracer=tracer, meter=MeterProvider().get_meter("t"))  # type: ignore[arg-type]
    out = _verdict(PARENTS["traceparent"])
    telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    # request, its two stages and the producer span; sampled out, the request alone
    assert tracer.started == (4 if exported else 1)
    assert len(exporter.get_finished_spans()) == exported
    version, trace_id, _, flags = dict(out.headers)["traceparent"].split(b"-")
    assert (version, trace_id) == (b"00", TRACEPARENT.split(b"-")[1])
    assert flags == (b"01" if exported else b"00")


def test_without_stage_spans_the_stages_are_attributes_of_the_request_span() -> None:
    """Two spans instead of four (request, send), the same trace and parentage, the
    stage durations on the request span, still counted in the stage histogram."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = _CountingTracer(provider.get_tracer("t"))
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    telemetry = Telemetry(
        tracer=tracer,  # type: ignore[arg-type]
        meter=MeterProvider().get_meter("t"),
        stage_spans=False,
        stage_durations=local,
    )
    out = _verdict(PARENTS["traceparent"])
    telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    assert tracer.started == 2
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans.keys() == {"guardrail.request", "send rag.verdicts"}
    request, send = spans["guardrail.request"], spans["send rag.verdicts"]
    assert request.attributes is not None
    stages = {k: v for k, v in request.attributes.items() if k.startswith("guardrail.stage.")}
    assert stages == {  # _verdict's stages: join 10..20 ns, policy 20..30 ns
        "guardrail.stage.join.duration_ms": 1e-5,
        "guardrail.stage.policy.duration_ms": 1e-5,
    }
    assert request.attributes["guardrail.decision"] == "allow"
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert request.context.trace_id == int(TRACEPARENT.split(b"-")[1], 16)
    _, _, span_id, _ = dict(out.headers)["traceparent"].split(b"-")
    assert int(span_id, 16) == send.context.span_id
    assert sorted(local.snapshot()) == ["join", "policy", "publish"]


def test_the_sidecar_passes_its_stage_spans_setting_on() -> None:
    setup = TelemetrySetup(shutdown=lambda _timeout_s: None, tracing=True, metrics=False)
    assert Telemetry.from_setup(setup).stage_spans
    assert not Telemetry.from_setup(setup, stage_spans=False).stage_spans


def test_the_setup_decides_where_stage_durations_go() -> None:
    """Prometheus alone: the plain histogram; another reader: the SDK's; none: nowhere."""
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    served = Telemetry.from_setup(
        TelemetrySetup(
            shutdown=lambda _timeout_s: None, tracing=False, metrics=True, stage_durations=local
        )
    )
    assert served.stage_durations is local and served.stage_duration is None
    assert not served.spans
    read = Telemetry.from_setup(
        TelemetrySetup(shutdown=lambda _timeout_s: None, tracing=True, metrics=True)
    )
    assert isinstance(read.stage_durations, OtelStageDurations) and read.spans
    unread = Telemetry.from_setup(
        TelemetrySetup(shutdown=lambda _timeout_s: None, tracing=False, metrics=False)
    )
    assert unread.stage_duration is None
    assert not isinstance(unread.stage_durations, OtelStageDurations | LocalStageDurations)
    unread.stage_durations.record("join", 0.001)  # discarded, and does not raise


def test_only_an_installed_provider_counts() -> None:
    assert not installed(ProxyTracerProvider()) and not installed(NoOpTracerProvider())
    assert installed(TracerProvider()) and installed(MeterProvider())
