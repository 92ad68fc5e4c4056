"""OpenTelemetry at the edge: spans from the processor's trace records, and metrics.

Tracing is configured by the standard ``OTEL_*`` variables: with
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set,
spans go to that OTLP/HTTP receiver; without it the API's no-op tracer is used
and a span costs a function call. ``OTEL_SDK_DISABLED=true`` turns everything off.
W3C trace context is read from the input messages' headers (the LLM service's
span becomes the parent) and written into the headers of every claim and answer
verdict, so downstream apps continue the trace.

Spans (all children of the LLM service's span when it sent ``traceparent``):
  sidecar.request         one per answer verdict; attributes request_id, tenant,
                          decision, reasons, policy, model.*; children:
    sidecar.join          first event of the request -> both halves present
    sidecar.certify       conformal certification of the retrieval event
    sidecar.score         lookback-ratio scoring
    sidecar.verify_claims claim verification of the answer's tail
    sidecar.policy        the decision
    sidecar.publish       producing the verdict until the broker confirmed it
  sidecar.verify_claim    one per claim verdict streamed mid-answer

Metrics (meter ``guardrail.sidecar``):
  guardrail.verdicts            counter     decision, reason
  guardrail.claim_verdicts      counter     label
  guardrail.dead_letters        counter     reason
  guardrail.stage.duration      histogram   stage (ms)
  guardrail.publish.retries     counter
  guardrail.join.open_requests  gauge
  guardrail.join.evictions      gauge (cumulative: capacity + ttl)
  guardrail.consumer.lag        gauge       topic, partition
  guardrail.join.partition_mismatch, .byte_evictions, guardrail.feedback.unmatched,
  .replaced, .early, guardrail.pipeline.internal_errors
                                counters (cumulative, observed at collection)
  guardrail.retrieval.m1_mean, .m1_wilson_low, .m1_wilson_high, .exchangeability_broken
                                gauges      calibration_key (the rolling m1 monitor)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Tracer

from sidecar import __version__
from sidecar.pipeline.outputs import Destination, Output, TraceRecord

SCOPE = "guardrail.sidecar"


def _enabled(signal: str) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def configure_from_env(prometheus_port: int | None = None) -> Callable[[], None]:
    """Install SDK providers when the environment asks for them; returns a shutdown hook."""
    hooks: list[Callable[[], Any]] = []
    if _enabled("TRACES"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        provider = TracerProvider(resource=_resource(Resource))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        hooks.append(provider.shutdown)
    readers: list[Any] = []
    if _enabled("METRICS"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            PeriodicExportingMetricReader,
        )

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    if prometheus_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415
        from prometheus_client import start_http_server  # noqa: PLC0415

        start_http_server(prometheus_port)
        readers.append(PrometheusMetricReader())
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

        meter_provider = MeterProvider(metric_readers=readers, resource=_resource(Resource))
        metrics.set_meter_provider(meter_provider)
        hooks.append(meter_provider.shutdown)

    def shutdown() -> None:
        for hook in hooks:
            hook()

    return shutdown


def _resource(resource_cls: Any) -> Any:
    return resource_cls.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "guardrail-sidecar"),
            "service.version": __version__,
        }
    )


def _carrier(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    return {k: v.decode("utf-8", errors="replace") for k, v in headers}


class Telemetry:
    """Turns trace records into spans and keeps the sidecar's instruments."""

    def __init__(
        self,
        tracer: Tracer | None = None,
        meter: metrics.Meter | None = None,
    ) -> None:
        self.tracer = tracer or trace.get_tracer(SCOPE, __version__)
        self.meter = meter or metrics.get_meter(SCOPE, __version__)
        self.verdicts = self.meter.create_counter(
            "guardrail.verdicts", description="answer verdicts"
        )
        self.claims = self.meter.create_counter(
            "guardrail.claim_verdicts", description="claim verdicts"
        )
        self.dead_letters = self.meter.create_counter(
            "guardrail.dead_letters", description="DLQ messages"
        )
        self.stage_ms = self.meter.create_histogram(
            "guardrail.stage.duration", unit="ms", description="per-stage latency"
        )
        self.publish_retries = self.meter.create_counter("guardrail.publish.retries")

    def observe(
        self,
        open_requests: Callable[[], int],
        evictions: Callable[[], int],
        lag: Callable[[], dict[tuple[str, int], int]],
    ) -> None:
        """Register the observable gauges (read at collection time, not per message)."""

        def _one(fn: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _options: [Observation(fn())]

        def _lag(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(v, {"topic": t, "partition": p}) for (t, p), v in lag().items()]

        self.meter.create_observable_gauge("guardrail.join.open_requests", [_one(open_requests)])
        self.meter.create_observable_gauge("guardrail.join.evictions", [_one(evictions)])
        self.meter.create_observable_gauge("guardrail.consumer.lag", [_lag])

    def observe_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        """Cumulative counts kept by the pipeline, as observable counters ``guardrail.<name>``."""
        for name in counts():

            def _count(_options: CallbackOptions, name: str = name) -> Iterable[Observation]:
                return [Observation(counts().get(name, 0))]

            self.meter.create_observable_counter(f"guardrail.{name}", [_count])

    def observe_monitor(
        self, statuses: Callable[[], dict[str, tuple[float, float, float, bool]]]
    ) -> None:
        """The rolling mean(m1) monitor per calibration key: (mean, low, high, broken)."""

        def _gauge(index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def read(_options: CallbackOptions) -> Iterable[Observation]:
                return [
                    Observation(float(values[index]), {"calibration_key": key})
                    for key, values in statuses().items()
                ]

            return read

        for index, name in enumerate(
            ("m1_mean", "m1_wilson_low", "m1_wilson_high", "exchangeability_broken")
        ):
            self.meter.create_observable_gauge(f"guardrail.retrieval.{name}", [_gauge(index)])

    def observe_coverage(self, reports: Callable[[], dict[str, dict[str, float | None]]]) -> None:
        """The seed-003 coverage bound per calibration key (the latest values of each quantity).

        ``reports()`` maps a calibration key to named values (``coverage``,
        ``coverage_low``, ``epsilon``, ``delta``, ``bound``, ``bound_high``,
        ``measured_hallucination``, ``violated``, ...); each name becomes the gauge
        ``guardrail.coverage.<name>``; a value that is ``None`` is not reported.
        """
        names = (
            "coverage",
            "coverage_low",
            "coverage_high",
            "epsilon",
            "epsilon_high",
            "delta",
            "delta_high",
            "bound",
            "bound_low",
            "bound_high",
            "measured_hallucination",
            "measured_hallucination_low",
            "measured_hallucination_high",
            "violated",
            "window_requests",
        )

        def _gauge(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def read(_options: CallbackOptions) -> Iterable[Observation]:
                return [
                    Observation(float(value), {"calibration_key": key})
                    for key, values in reports().items()
                    if (value := values.get(name)) is not None
                ]

            return read

        for name in names:
            self.meter.create_observable_gauge(f"guardrail.coverage.{name}", [_gauge(name)])

    def before_publish(self, out: Output) -> tuple[Any, int] | None:
        """Open the output's span tree; inject its context into the output's headers."""
        record = out.trace
        if out.destination is Destination.DLQ:
            reason = out.header("x-dlq-reason") or b"unknown"
            self.dead_letters.add(1, {"reason": reason.decode("utf-8", errors="replace")})
        if record is None:
            return None
        self._count(out, record)
        parent = extract(_carrier(record.parent))
        span = self.tracer.start_span(
            record.name, context=parent, start_time=record.start_ns, attributes=record.attributes
        )
        ctx = trace.set_span_in_context(span, parent)
        for stage, start, end in record.stages:
            self.tracer.start_span(f"sidecar.{stage}", context=ctx, start_time=start).end(end)
            self.stage_ms.record((end - start) / 1e6, {"stage": stage})
        carrier: dict[str, str] = {}
        inject(carrier, context=ctx)
        out.headers[:] = [(k, v) for k, v in out.headers if k not in carrier] + [
            (k, v.encode("utf-8")) for k, v in carrier.items()
        ]
        publish = self.tracer.start_span("sidecar.publish", context=ctx)
        return (span, publish), record.end_ns

    def after_publish(self, handle: tuple[Any, int] | None) -> None:
        if handle is None:
            return
        (span, publish), end_ns = handle
        now = time.time_ns()
        publish.end(now)
        span.end(max(end_ns, now))

    def _count(self, out: Output, record: TraceRecord) -> None:
        attrs = record.attributes
        if out.destination is Destination.VERDICTS:
            reasons = attrs.get("reasons", [])
            for reason in reasons if isinstance(reasons, list) else [str(reasons)]:
                self.verdicts.add(1, {"decision": str(attrs.get("decision")), "reason": reason})
        elif out.destination is Destination.CLAIMS:
            self.claims.add(1, {"label": str(attrs.get("claim.label"))})
