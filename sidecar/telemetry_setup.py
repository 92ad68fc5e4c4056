"""Installing the OpenTelemetry SDK from the ``OTEL_*`` environment: OTLP exporters, Prometheus.

Configured by the SDK's standard ``OTEL_*`` variables. With
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT``)
set, spans (and metrics) go to that OTLP receiver over ``OTEL_EXPORTER_OTLP_PROTOCOL``
(or the per-signal ``..._TRACES_PROTOCOL``): ``grpc`` (port 4317) or
``http/protobuf`` (port 4318, the default); any other value stops the process at
start. ``OTEL_TRACES_SAMPLER`` / ``_ARG``, ``OTEL_BSP_*``, ``OTEL_RESOURCE_ATTRIBUTES``
are read by the SDK itself; ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``
turn tracing off. Without an endpoint the API's no-op tracer is used (a span costs a
function call).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics, trace

from sidecar import __version__
from sidecar.exceptions import ConfigError

__all__ = ["PROTOCOLS", "configure_from_env", "otlp_protocol"]

PROTOCOLS = ("grpc", "http/protobuf")


def _enabled(signal: str) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get(f"OTEL_{signal}_EXPORTER", "").lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def otlp_protocol(signal: str) -> str:
    """The OTLP protocol for ``signal`` (TRACES or METRICS), as the SDK's variables say."""
    name = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    value = os.environ.get(name) or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = (value or "http/protobuf").strip().lower()
    if protocol not in PROTOCOLS:
        where = name if os.environ.get(name) else "OTEL_EXPORTER_OTLP_PROTOCOL"
        raise ConfigError(f"{where} must be one of {', '.join(PROTOCOLS)}, got {value!r}")
    return protocol


def _span_exporter() -> Any:
    if otlp_protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def _metric_exporter() -> Any:
    if otlp_protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()


def configure_from_env(prometheus_port: int | None = None) -> Callable[[], None]:
    """Install SDK providers when the environment asks for them; returns a shutdown hook.

    Raises ``ConfigError`` for an OTLP protocol other than grpc or http/protobuf.
    The sampler (``OTEL_TRACES_SAMPLER``) and the batch processor (``OTEL_BSP_*``)
    are configured by the SDK from the environment.
    """
    hooks: list[Callable[[], Any]] = []
    tracing, metering = _enabled("TRACES"), _enabled("METRICS")
    span_exporter = _span_exporter() if tracing else None
    metric_exporter = _metric_exporter() if metering else None
    if span_exporter is not None:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        provider = TracerProvider(resource=_resource(Resource))
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(provider)
        hooks.append(provider.shutdown)
    readers: list[Any] = []
    if metric_exporter is not None:
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            PeriodicExportingMetricReader,
        )

        readers.append(PeriodicExportingMetricReader(metric_exporter))
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
