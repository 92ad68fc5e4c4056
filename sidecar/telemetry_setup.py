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

What was installed comes back as a :class:`TelemetrySetup`, which tells
``Telemetry`` whether spans are recorded at all and where stage durations go
(``sidecar.stage_durations``): a plain histogram that Prometheus reads at scrape
time and the OTLP exporter at export time (``sidecar.local_metrics_otlp``),
instead of the SDK's per-record path; and where the per-calibration-key gauges go
(``sidecar.keyed_gauges``): read the same way, instead of through the SDK, which
remembers every key it ever saw.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry import metrics, trace

from sidecar import __version__
from sidecar.exceptions import ConfigError
from sidecar.keyed_gauges import KeyedGauges
from sidecar.redact import redact_text, redact_url
from sidecar.stage_durations import (
    DESCRIPTION,
    DURATION_BUCKETS_S,
    SCOPE,
    LocalStageDurations,
)

__all__ = [
    "PROTOCOLS",
    "SAMPLERS",
    "TelemetrySetup",
    "batch_settings",
    "configure_from_env",
    "describe_env",
    "exporter_choice",
    "installed",
    "otlp_endpoint",
    "otlp_protocol",
    "traces_sampler",
]

PROTOCOLS = ("grpc", "http/protobuf")
# the names the SDK's TracerProvider reads from OTEL_TRACES_SAMPLER; on any other it logs
# a warning and records every span
SAMPLERS = (
    "always_on",
    "always_off",
    "parentbased_always_on",
    "parentbased_always_off",
    "traceidratio",
    "parentbased_traceidratio",
)
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
# gRPC name-resolver schemes the gRPC exporter hands to its channel as they are (a URL
# with no host part: ``unix:///run/otel.sock``, ``dns:///otel-collector:4317``)
GRPC_TARGET_SCHEMES = ("unix", "unix-abstract", "dns", "ipv4", "ipv6")
# what the last export may take when the caller names no limit (the SDK's own default)
SHUTDOWN_TIMEOUT_S = 30.0

log = logging.getLogger("sidecar")


EXPORTERS = ("otlp", "none")  # what OTEL_{TRACES,METRICS}_EXPORTER may say here


def exporter_choice(signal: str) -> str:
    """``OTEL_<signal>_EXPORTER`` (TRACES or METRICS): ``otlp`` (the default) or ``none``.

    The SDK's auto-configuration, which reads other names (console, zipkin,
    prometheus, ...), is not used: anything else would be silently ignored.
    """
    name = f"OTEL_{signal}_EXPORTER"
    value = os.environ.get(name)
    choice = (value or "otlp").strip().lower()
    if choice not in EXPORTERS:
        hint = (
            "; Prometheus is served with GUARDRAIL_METRICS__PROMETHEUS_PORT"
            if "prometheus" in choice
            else ""
        )
        raise ConfigError(f"{name} must be one of {', '.join(EXPORTERS)}, got {value!r}{hint}")
    return choice


def _enabled(signal: str) -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if exporter_choice(signal) == "none":
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


def otlp_endpoint(signal: str) -> str:
    """The OTLP endpoint for ``signal`` (TRACES or METRICS): the per-signal variable, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; an http or https URL with a host (and a port in
    1-65535 if it names one).

    Checked because the exporters take anything and fail at each export: ``localhost:4318``
    (no scheme), ``http://collector:99999`` or a typo started the sidecar, ``run --check``
    said ok, and every span and metric was dropped with an ERROR line per interval
    (audit); gRPC dialled port 99999 as 34463.
    """
    own = f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"
    name = own if os.environ.get(own) else "OTEL_EXPORTER_OTLP_ENDPOINT"
    value = os.environ.get(name, "")
    url = value.strip()
    grpc = otlp_protocol(signal) == "grpc"
    scheme, colon, target = url.partition(":")
    if (
        grpc
        and colon
        and scheme.lower() in GRPC_TARGET_SCHEMES
        and target.strip("/")
        and not any(c.isspace() for c in url)
    ):
        return url  # a gRPC target (a collector on a Unix socket): its channel resolves it
    # the gRPC exporter also dials a bare host:port (TLS unless OTEL_EXPORTER_OTLP_INSECURE
    # is true): a configuration that worked before this check must keep starting
    bare = grpc and "://" not in url
    try:
        parts = urlsplit(f"//{url}" if bare else url)
        port = parts.port  # ValueError when not a number in 0-65535
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or (not bare and parts.scheme.lower() not in ("http", "https"))
        or (bare and (port is None or parts.path not in ("", "/")))
        or not parts.hostname
        or port == 0
        or any(c.isspace() for c in url)
    ):
        raise ConfigError(
            f"{name} must be an http:// or https:// URL with a host and an optional port in "
            f"1-65535 (e.g. http://otel-collector:4317 for grpc, :4318 for http/protobuf; "
            f"https:// for TLS; grpc also takes host:port and unix:, dns:, ipv4:, ipv6: "
            f"targets), got {redact_url(value)!r}"
        )
    return url


def _signal_variable(signal: str, suffix: str) -> tuple[str, str | None]:
    """The variable the exporters read for ``signal``: ``OTEL_EXPORTER_OTLP_<signal>_<suffix>``
    when set, else ``OTEL_EXPORTER_OTLP_<suffix>``; and its value (``None``: unset or empty)."""
    own = f"OTEL_EXPORTER_OTLP_{signal}_{suffix}"
    name = own if os.environ.get(own, "").strip() else f"OTEL_EXPORTER_OTLP_{suffix}"
    return name, os.environ.get(name, "").strip() or None


DEFAULT_EXPORT_TIMEOUT_S: Final = 10.0  # the Python exporters' own default
LONG_EXPORT_TIMEOUT_S: Final = 600.0


def export_timeout_s(signal: str) -> float:
    """Seconds one OTLP export may take for ``signal``: ``OTEL_EXPORTER_OTLP_[<signal>_]TIMEOUT``.

    Read here and passed to the exporter, because the gRPC exporter raised a bare
    ``ValueError`` (a traceback) for a value that is not a number, even an empty one, and
    took a negative one (every export then failed at once); the HTTP one used its default
    with a warning (audit). Seconds, as the Python exporters read it (the specification
    says milliseconds: :func:`describe_env` warns of a value above ten minutes).
    """
    name, value = _signal_variable(signal, "TIMEOUT")
    own = f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"
    if own in os.environ and not os.environ[own].strip() and otlp_protocol(signal) == "grpc":
        raise ConfigError(  # the gRPC exporter reads its own variable whatever it is passed
            f"{own} is set but empty, which the gRPC exporter cannot read: unset it or give "
            "a number of seconds above 0"
        )
    if value is None:
        return DEFAULT_EXPORT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"{name} must be a number of seconds above 0 (the Python OTLP exporters read "
            f"seconds; the specification says milliseconds), got {value!r}"
        )
    return seconds


# what each exporter takes for OTEL_EXPORTER_OTLP_[<signal>_]COMPRESSION
COMPRESSIONS: Final = {"grpc": ("gzip", "none"), "http/protobuf": ("gzip", "deflate", "none")}


def export_compression(signal: str) -> str:
    """``OTEL_EXPORTER_OTLP_[<signal>_]COMPRESSION`` for ``signal``, one of
    :data:`COMPRESSIONS` (``none`` when unset): the gRPC exporter raised for any other
    value, ``none`` included, and the HTTP one sent uncompressed with a warning (audit)."""
    name, value = _signal_variable(signal, "COMPRESSION")
    protocol = otlp_protocol(signal)
    choice = (value or "none").lower()
    if choice not in COMPRESSIONS[protocol]:
        allowed = ", ".join(COMPRESSIONS[protocol])
        raise ConfigError(f"{name} must be one of {allowed} with {protocol}, got {value!r}")
    return choice


# what the SDK's header parser takes (opentelemetry.util.re, liberal): a name of HTTP
# token characters, and a value of printable ASCII but for " , ; \ (percent-encode those)
_HEADER_ITEM: Final = re.compile(
    r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+[ \t]*="
    r"[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
)


def check_export_headers(signal: str) -> None:
    """``OTEL_EXPORTER_OTLP_[<signal>_]HEADERS`` is a comma-separated list of name=value.

    The exporters drop an item they cannot read with a warning and export without it:
    a collector's API key written with a stray character sent every span unauthenticated
    (refused, dropped) while the sidecar said nothing more (audit). The values are often
    secrets: the message names the item by its position, never its text.
    """
    name, value = _signal_variable(signal, "HEADERS")
    items = [item for item in re.split(r"[ \t]*,[ \t]*", value or "") if item]
    for position, item in enumerate(items, start=1):
        if not _HEADER_ITEM.fullmatch(item.strip()):
            raise ConfigError(
                f"{name}: item {position} of {len(items)} is not name=value (a name of "
                "letters, digits and !#$%&'*+-.^_`|~; a value of printable ASCII with "
                '" , ; \\ percent-encoded, e.g. api-key=abc%2C1); its text is not shown'
            )


def check_resource_attributes() -> None:
    """``OTEL_RESOURCE_ATTRIBUTES`` is a comma-separated list of key=value with a key: the
    SDK dropped any other item with a warning, and the spans went out without it (audit)."""
    value = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    items = [item for item in value.split(",") if item.strip()]
    for item in items:
        key, equals, _ = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(
                f"OTEL_RESOURCE_ATTRIBUTES must be a comma-separated list of key=value "
                f"(values percent-encoded), got the item {redact_text(repr(item))}"
            )


def traces_sampler() -> tuple[str, float | None]:
    """The sampler ``OTEL_TRACES_SAMPLER`` names and its ratio (``OTEL_TRACES_SAMPLER_ARG``).

    Checked because the SDK is lenient where a typo is expensive: an unknown sampler
    name or a ratio that is not a number makes it log a warning and record every
    verdict's spans (~8x the telemetry cost of a sampled-out one).
    """
    value = os.environ.get("OTEL_TRACES_SAMPLER")
    name = (value if value is not None else "parentbased_always_on").lower()  # as the SDK
    if name not in SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER must be one of {', '.join(SAMPLERS)}, got {value!r}"
        )
    if name not in RATIO_SAMPLERS:
        return name, None
    arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG")
    try:
        ratio = float(arg) if arg is not None else math.nan
    except ValueError:
        ratio = math.nan
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER_ARG must be a ratio in [0, 1] for {name} "
            f"(the share of traces recorded, e.g. 0.1), got {arg!r}"
        )
    return name, ratio


# the SDK's defaults of what it reads from the environment for the batch span processor
# and the periodic metric reader (milliseconds, or spans)
_BATCH_DEFAULTS: Final = {
    "OTEL_BSP_SCHEDULE_DELAY": 5000,
    "OTEL_BSP_EXPORT_TIMEOUT": 30000,
    "OTEL_BSP_MAX_QUEUE_SIZE": 2048,
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": 512,
}
_READER_DEFAULTS: Final = {
    "OTEL_METRIC_EXPORT_INTERVAL": 60000,
    "OTEL_METRIC_EXPORT_TIMEOUT": 30000,
}


# what the SDK takes that a count or a delay may not be: a timeout of 0 (it never checks
# one), and an export interval of inf (no periodic export: the metrics go out at stopping)
_ZERO_ALLOWED: Final = ("OTEL_BSP_EXPORT_TIMEOUT", "OTEL_METRIC_EXPORT_TIMEOUT")
_INF_ALLOWED: Final = ("OTEL_METRIC_EXPORT_INTERVAL",)


def _positive(name: str, default: int, *, whole: bool) -> float:
    """``name``'s value as the SDK reads it (``int`` or ``float``), which must be above 0
    (at least 0: a timeout; inf: the metric export interval)."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value) if whole else float(value)
    except ValueError:
        number = math.nan
    least_ok = number >= 0 if name in _ZERO_ALLOWED else number > 0
    if not least_ok or (math.isinf(number) and name not in _INF_ALLOWED):
        kind = "a whole number" if whole else "a number"
        bound = "of at least 0" if name in _ZERO_ALLOWED else "above 0"
        raise ConfigError(f"{name} must be {kind} {bound}, got {value!r}")
    return number


def batch_settings(signal: str) -> dict[str, float]:
    """The ``OTEL_BSP_*`` (TRACES) or ``OTEL_METRIC_EXPORT_*`` (METRICS) values, checked.

    The SDK reads a value that is not a number as its default (with a line at most), and
    raises a bare ``ValueError`` for 0 or a negative one, or a batch above the queue,
    when the sidecar has already reached Kafka: a traceback, and ``run --check`` had said
    ok (audit)."""
    if signal == "TRACES":
        got = {k: _positive(k, d, whole=True) for k, d in _BATCH_DEFAULTS.items()}
        queue, batch = got["OTEL_BSP_MAX_QUEUE_SIZE"], got["OTEL_BSP_MAX_EXPORT_BATCH_SIZE"]
        if batch > queue:
            raise ConfigError(
                f"OTEL_BSP_MAX_EXPORT_BATCH_SIZE ({batch:g}) must be at most "
                f"OTEL_BSP_MAX_QUEUE_SIZE ({queue:g})"
            )
        return got
    return {k: _positive(k, d, whole=False) for k, d in _READER_DEFAULTS.items()}


def describe_env() -> dict[str, str]:
    """What :func:`configure_from_env` would export over OTLP, checked without installing
    anything (``guardrail run --check``). Raises ``ConfigError`` as it would."""
    described = {}
    check_resource_attributes()
    if _enabled("TRACES"):
        name, ratio = traces_sampler()
        sampler = name if ratio is None else f"{name} {ratio:g}"
        _check_exporter("TRACES")
        batch_settings("TRACES")
        described["traces"] = f"otlp {otlp_protocol('TRACES')}, {sampler}"
    if _enabled("METRICS"):
        _check_exporter("METRICS")
        batch_settings("METRICS")
        described["metrics"] = f"otlp {otlp_protocol('METRICS')}"
    return described


def _check_exporter(signal: str) -> None:
    otlp_endpoint(signal)
    seconds = export_timeout_s(signal)
    if seconds > LONG_EXPORT_TIMEOUT_S:
        log.warning(
            "%s is read as %g seconds, as the Python OTLP exporters read it (%g milliseconds, "
            "as the specification reads it, would be %g s): an export to a silent collector "
            "may block that long",
            _signal_variable(signal, "TIMEOUT")[0], seconds, seconds, seconds / 1000,
        )  # fmt: skip
    export_compression(signal)
    check_export_headers(signal)


def _grpc_options(signal: str) -> dict[str, Any]:
    """What the gRPC exporter would misread from the environment, read here."""
    from grpc import Compression  # noqa: PLC0415

    kinds = {"gzip": Compression.Gzip, "none": Compression.NoCompression}
    return {"timeout": export_timeout_s(signal), "compression": kinds[export_compression(signal)]}


def _http_options(signal: str) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression  # noqa: PLC0415

    return {
        "timeout": export_timeout_s(signal),
        "compression": Compression(export_compression(signal)),
    }


def _span_exporter() -> Any:
    if otlp_protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter(**_grpc_options("TRACES"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter(**_http_options("TRACES"))


def _metric_exporter() -> Any:
    if otlp_protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter(**_grpc_options("METRICS"))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(**_http_options("METRICS"))


def installed(provider: object) -> bool:
    """A provider someone installed (an SDK's), not the API's proxy or no-op default."""
    api = ("opentelemetry.trace", "opentelemetry.metrics")
    return not type(provider).__module__.startswith(api)


@dataclass(frozen=True, slots=True)
class TelemetrySetup:
    """What :func:`configure_from_env` installed, for ``Telemetry.from_setup``."""

    shutdown: Callable[[float], None]
    """Export what is held and stop the exporters, taking at most the seconds given: an
    OTLP endpoint that does not answer costs that long, not the SDK's 30 s per provider."""
    tracing: bool
    """A tracer provider records spans (ours from OTLP, or one installed before us)."""
    metrics: bool
    """A meter provider reads the instruments (ours, or one installed before us)."""
    stage_durations: LocalStageDurations | None = None
    """Set when our readers read stage durations from the plain histogram (Prometheus
    at scrape time, OTLP through ``LocalMetricsExporter``) instead of the SDK's."""
    keyed_gauges: KeyedGauges | None = None
    """Set when our readers read the per-calibration-key gauges (Prometheus at scrape
    time, OTLP through ``LocalMetricsExporter``): always, with a reader of ours."""


def configure_from_env(
    prometheus_port: int | None = None,
    prometheus_host: str = "0.0.0.0",  # noqa: S104
) -> TelemetrySetup:
    """Install SDK providers when the environment asks for them.

    Raises ``ConfigError`` for an OTLP protocol other than grpc or http/protobuf, and
    (tracing on) for a sampler or sampler ratio the SDK would not understand.
    The sampler (``OTEL_TRACES_SAMPLER``) and the batch processor (``OTEL_BSP_*``)
    are configured by the SDK from the environment.
    """
    described = describe_env()  # a setting the SDK would misread stops the process here
    hooks: list[Callable[[], Any]] = []
    tracing, metering = "traces" in described, "metrics" in described
    span_exporter = _span_exporter() if tracing else None
    metric_exporter = _metric_exporter() if metering else None
    if span_exporter is not None:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        provider = TracerProvider(resource=_resource(Resource), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(provider)
        hooks.append(provider.shutdown)
    readers: list[Any] = []
    # the stage histogram need not go through the SDK unless its exporter wants
    # another aggregation than explicit buckets
    local: LocalStageDurations | None = None
    # the per-key gauges never go through the SDK with a reader of ours: it keeps every
    # key it ever saw, and puts those past 2,000 in one overflow series
    keyed = KeyedGauges(_SCOPE_LABELS) if metric_exporter is not None or prometheus_port else None
    if metric_exporter is not None:
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            PeriodicExportingMetricReader,
        )

        from sidecar.local_metrics_otlp import (  # noqa: PLC0415
            LocalMetricsExporter,
            exports_explicit_buckets,
        )

        if exports_explicit_buckets(metric_exporter):
            local = _stage_durations()
        metric_exporter = LocalMetricsExporter(metric_exporter, local, keyed)
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    if prometheus_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415

        from sidecar.metrics_server import serve_metrics  # noqa: PLC0415

        try:
            serve_metrics(prometheus_port, prometheus_host)
        except OSError as exc:  # a port in use, an address not on this host, a bad name
            raise ConfigError(
                f"the Prometheus endpoint cannot listen on {prometheus_host}:{prometheus_port}: "
                f"{exc} (GUARDRAIL_METRICS__PROMETHEUS_HOST: an address of this host; "
                "GUARDRAIL_METRICS__PROMETHEUS_PORT: a free port)"
            ) from None
        readers.append(PrometheusMetricReader())
        if metric_exporter is None:
            local = _stage_durations()
        if local is not None:
            _serve(local, hooks)
        _serve(keyed, hooks)
    if readers:
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

        meter_provider = MeterProvider(
            metric_readers=readers, resource=_resource(Resource), shutdown_on_exit=False
        )
        metrics.set_meter_provider(meter_provider)
        hooks.append(meter_provider.shutdown)

    def shutdown(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        _within(hooks, timeout_s)

    return TelemetrySetup(
        shutdown=shutdown,
        tracing=installed(trace.get_tracer_provider()),
        metrics=installed(metrics.get_meter_provider()),
        stage_durations=local,
        keyed_gauges=keyed,
    )


def _within(hooks: list[Callable[[], Any]], timeout_s: float) -> None:
    """Run each of ``hooks`` on a daemon thread of its own, all waited for at most
    ``timeout_s`` together.

    The SDK's providers take no deadline of their own (``TracerProvider.shutdown`` waits
    up to 30 s for its batch processor, ``MeterProvider.shutdown`` 30 s more, and each
    export up to ``OTEL_EXPORTER_OTLP_TIMEOUT``): with the endpoint unreachable or silent,
    a SIGTERM took 42-49 s to end the process (audit), past the shutdown grace and the
    pod's termination grace. Spans and metrics stop side by side (one slow exporter does
    not eat the other's time); what is not exported by then is dropped, and the threads,
    daemons, do not hold the process (the providers are built without exit handlers).
    """

    def guarded(hook: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                hook()
            except Exception:  # one provider's failure must not hide the others'
                log.exception("stopping telemetry failed")

        return run

    workers = [
        threading.Thread(target=guarded(hook), name="guardrail-telemetry-stop", daemon=True)
        for hook in hooks
    ]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + max(0.0, timeout_s)
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    if any(worker.is_alive() for worker in workers):
        log.warning(
            "telemetry export did not finish within %.1f s of stopping: spans and metrics "
            "the OTLP endpoint has not received are dropped",
            timeout_s,
        )


# the labels the SDK's Prometheus exporter puts on every other metric of the page
_SCOPE_LABELS: Final = {
    "otel_scope_name": SCOPE,
    "otel_scope_version": __version__,
    "otel_scope_schema_url": "",
}


def _stage_durations() -> LocalStageDurations:
    """The plain stage histogram, labelled as the SDK labels its instruments."""
    return LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION, scope=_SCOPE_LABELS)


def _serve(collector: Any, hooks: list[Callable[[], Any]]) -> None:
    """Put ``collector`` in the registry ``/metrics`` serves (removed at shutdown)."""
    from prometheus_client import REGISTRY  # noqa: PLC0415

    REGISTRY.register(collector)
    hooks.append(lambda: REGISTRY.unregister(collector))


def _resource(resource_cls: Any) -> Any:
    return resource_cls.create(
        {
            "service.name": os.environ.get("OTEL_SERVICE_NAME", "guardrail-sidecar"),
            "service.version": __version__,
        }
    )
