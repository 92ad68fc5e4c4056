from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import ConsumerRecord
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar import telemetry_setup
from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    Decision,
    FeedbackEvent,
    Reason,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.exceptions import ConfigError
from sidecar.keyed_gauges import KeyedGauges
from sidecar.local_metrics_otlp import keyed_gauge_metrics
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Output, TraceRecord, verdict_attributes
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.stage_durations import LocalStageDurations
from sidecar.telemetry import (
    DURATION_BUCKETS_S,
    GAUGE_HELP,
    MAX_KEY_ATTRIBUTE_BYTES,
    Telemetry,
    _record_attributes,
)
from sidecar.telemetry_setup import (
    configure_from_env,
    describe_env,
    otlp_endpoint,
    otlp_protocol,
    traces_sampler,
)
from tests.conftest import EventFactory, dumps


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = list(m.data.data_points)
    return out


def keyed_points(keyed: KeyedGauges) -> dict[str, list[Any]]:
    """The per-key gauges' points, as the OTLP exporter sends them (``points``' shape)."""
    return {m.name: list(m.data.data_points) for m in keyed_gauge_metrics(keyed, 1)}


def instruments(reader: InMemoryMetricReader) -> dict[str, tuple[str, str]]:
    """Each metric's unit and point kind (Sum, Gauge, Histogram)."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: (m.unit or "", type(m.data).__name__)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def test_verdicts_dead_letters_stages_and_gauges_are_counted(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    processor = Processor(settings_factory(), PlaceholderPolicy())
    telemetry.observe(lambda: len(processor.store), lambda: 7, lambda: {("rag.retrieval", 0): 3})
    steps = [
        processor.on_message(
            InputKind.RETRIEVAL, dumps(retrieval_event()), None, InputRef("r", 0, 0), 0
        ),
        processor.on_message(
            InputKind.GENERATION, dumps(final_event()), None, InputRef("g", 0, 0), 0
        ),
        processor.on_message(InputKind.GENERATION, b"{", None, InputRef("g", 0, 1), 0),
    ]
    for step in steps:
        for out in step.outputs:
            telemetry.after_publish(telemetry.before_publish(out, "rag.out"))
    got = points(reader)
    [verdict] = got["guardrail.verdicts"]
    assert verdict.value == 1
    assert dict(verdict.attributes) == {"decision": "caveat", "profile": "none", "stage": "final"}
    [reason] = got["guardrail.verdict.reasons"]
    assert dict(reason.attributes) == {"reason": "no-signals-configured", "decision": "caveat"}
    assert reason.value == 1
    [dead] = got["guardrail.dead_letters"]
    assert dict(dead.attributes) == {"reason": "malformed-json"} and dead.value == 1
    stages = {dict(p.attributes)["stage"]: p for p in got["guardrail.stage.duration"]}
    assert {"join", "certify", "score", "policy", "publish"} <= set(stages)
    assert tuple(stages["policy"].explicit_bounds) == DURATION_BUCKETS_S
    assert got["guardrail.join.evictions"][0].value == 7
    assert got["guardrail.consumer.lag"][0].value == 3
    assert got["guardrail.join.open_requests"][0].value == 0
    kinds = instruments(reader)
    assert kinds["guardrail.stage.duration"] == ("s", "Histogram")
    assert kinds["guardrail.join.evictions"] == ("{request}", "Sum")  # cumulative: a counter
    assert kinds["guardrail.join.open_requests"][1] == "Gauge"
    assert kinds["guardrail.consumer.lag"][1] == "Gauge"


def test_level_gauges_read_the_loop_at_each_collection_and_decisions_start_at_zero() -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    levels = {"queue.records": 0, "queue.bytes": 0, "consumer.paused_partitions": 0}
    telemetry.observe_gauges(lambda: dict(levels))
    telemetry.preset_verdicts(("medical", "enterprise"))
    got = points(reader)
    assert {name: p[0].value for name, p in got.items() if name in GAUGES} == dict.fromkeys(
        GAUGES, 0
    )
    zeros = {
        (dict(p.attributes)["decision"], dict(p.attributes)["profile"]): p.value
        for p in got["guardrail.verdicts"]
    }
    assert zeros == {
        (d, p): 0 for d in ("allow", "caveat", "block") for p in ("medical", "enterprise", "none")
    }
    assert {dict(p.attributes)["stage"] for p in got["guardrail.verdicts"]} == {"final"}
    levels.update({"queue.records": 500, "queue.bytes": 123_456, "consumer.paused_partitions": 3})
    got = points(reader)
    assert {name: got[name][0].value for name in GAUGES} == {
        "guardrail.queue.records": 500,
        "guardrail.queue.bytes": 123_456,
        "guardrail.consumer.paused_partitions": 3,
    }
    assert all(instruments(reader)[name][1] == "Gauge" for name in GAUGES)
    assert all(GAUGE_HELP[name.removeprefix("guardrail.")] for name in GAUGES)


GAUGES = (
    "guardrail.queue.records",
    "guardrail.queue.bytes",
    "guardrail.consumer.paused_partitions",
)


def test_coverage_bound_gauges_follow_the_monitor() -> None:
    """Verdicts and feedback through a CoverageMonitor show up as guardrail.coverage.* gauges."""
    keyed = KeyedGauges()
    telemetry = Telemetry(meter=MeterProvider().get_meter("t"), keyed_gauges=keyed)
    monitor = CoverageMonitor(window=100, probe=(10, 2))
    telemetry.observe_coverage(monitor.gauge_values)
    for i, covered in enumerate([True, True, True, False]):
        cert = RetrievalSignal(status=SignalStatus.OK, m1=covered, calibration_key="t/c/r")
        monitor.observe_verdict(
            AnswerVerdict(
                request_id=f"r{i}",
                idempotency_key=f"k{i}",
                decision=Decision.ALLOW,
                reasons=[],
                policy="p",
                signals=Signals(retrieval=cert),
                produced_at=datetime.now(UTC),
                sidecar_version="t",
            )
        )
        monitor.observe_feedback(FeedbackEvent(request_id=f"r{i}", correct=i != 0, source="t"))
    got = keyed_points(keyed)
    value = {
        name: got[f"guardrail.coverage.{name}"][0] for name in ("coverage", "epsilon", "delta")
    }
    assert dict(value["coverage"].attributes) == {"calibration_key": "t/c/r"}
    assert value["coverage"].value == 0.75  # 3 of 4 requests had a trusted chunk
    assert abs(value["epsilon"].value - 1 / 3) < 1e-12  # 1 wrong of 3 covered labels
    assert value["delta"].value == 0.2  # the probe: 2 of 10
    bound = got["guardrail.coverage.bound"][0].value
    assert abs(bound - (0.75 / 3 + 0.25 * 0.2)) < 1e-12
    assert got["guardrail.coverage.violated"][0].value == 0.0
    assert got["guardrail.coverage.window_requests"][0].value == 4


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        ({}, "http/protobuf", "http/protobuf"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "grpc", "grpc"),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
            },
            "grpc",
            "http/protobuf",
        ),
    ],
)
def test_the_otlp_protocol_follows_the_sdk_variables(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], traces: str, metrics: str
) -> None:
    for name in ("", "TRACES_", "METRICS_"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}PROTOCOL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (otlp_protocol("TRACES"), otlp_protocol("METRICS")) == (traces, metrics)


def test_an_unknown_otlp_protocol_fails_at_start_naming_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(
        ConfigError,
        match=r"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL must be one of grpc, http/protobuf, "
        r"got 'http/json'",
    ):
        configure_from_env()


@pytest.mark.parametrize(
    "endpoint",
    [
        "not a url",  # (a bare host:port: test_grpc_takes_a_bare_host_and_port_http_does_not)
        "http://127.0.0.1:99999",  # gRPC dialled 34463
        "http://127.0.0.1:0",
        "http://[::1",
        "ftp://collector:4318",
        "http://:4318",
        "http://user:hunter2@exa mple:4318",
        "http://user:hun ter2@collector:4318",  # the password's space: shown whole (audit)
        'http://user:hun"ter2@exa mple:4318',
    ],
)
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_otlp_endpoint_the_exporters_cannot_use_fails_at_start_naming_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch, endpoint: str, protocol: str
) -> None:
    """Audit: each of these started the sidecar (``run --check``: ok) and every span and
    metric was dropped at export, an ERROR line per interval."""
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    with pytest.raises(
        ConfigError, match=r"OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or"
    ) as e:
        describe_env()
    assert "ter2" not in str(e.value)
    with pytest.raises(ConfigError, match=r"OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or"):
        configure_from_env()


def _otlp_on(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Both signals exported to an OTLP endpoint, with ``env`` on top."""
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_BSP_MAX_QUEUE_SIZE": "0"},
            r"OTEL_BSP_MAX_QUEUE_SIZE must be a whole number above 0",
        ),
        (
            {"OTEL_BSP_SCHEDULE_DELAY": "-1"},
            r"OTEL_BSP_SCHEDULE_DELAY must be a whole number above",
        ),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}, r"OTEL_BSP_MAX_QUEUE_SIZE .* got 'lots'"),
        (
            {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"},
            r"OTEL_BSP_MAX_EXPORT_BATCH_SIZE \(4096\) must be at most OTEL_BSP_MAX_QUEUE_SIZE "
            r"\(2048\)",
        ),
        (
            {"OTEL_METRIC_EXPORT_INTERVAL": "0"},
            r"OTEL_METRIC_EXPORT_INTERVAL must be a number above",
        ),
        ({"OTEL_METRIC_EXPORT_TIMEOUT": "soon"}, r"OTEL_METRIC_EXPORT_TIMEOUT .* got 'soon'"),
    ],
)
def test_a_batch_setting_the_sdk_would_reject_or_replace_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """Audit: 0 or a negative value raised the SDK's bare ValueError once Kafka was reached
    (a traceback; ``run --check`` said ok); a word was read as the default."""
    _otlp_on(monkeypatch, env)
    with pytest.raises(ConfigError, match=message):
        describe_env()
    with pytest.raises(ConfigError, match=message):
        configure_from_env()


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_BSP_EXPORT_TIMEOUT": "0"},
        {"OTEL_METRIC_EXPORT_TIMEOUT": "0"},
        {"OTEL_METRIC_EXPORT_INTERVAL": "inf"},  # the SDK's "only when stopping"
    ],
)
def test_a_batch_setting_the_sdk_takes_still_starts(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    """The SDK never checks a timeout, and reads an infinite interval as no periodic
    export: each started before the check, and stopped the start with it."""
    _otlp_on(monkeypatch, env)
    described = describe_env()
    assert set(described) >= {"traces", "metrics"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, r"OTEL_EXPORTER_OTLP_TIMEOUT must be a number of"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, r"seconds above 0 .* got '-5'"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "0"}, r"got '0'"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "nan"}, r"got 'nan'"),
        ({"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "inf"}, r"OTEL_EXPORTER_OTLP_METRICS_TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, r"COMPRESSION must be one of gzip, .*'zstd'"),
        ({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "br"}, r"OTEL_EXPORTER_OTLP_TRACES_COMPRESS"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cret,oops"}, r"item 2 of 2 is not name=value"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "api-key=s3cr\u00e9t"}, r"item 1 of 1"),
        ({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "=s3cret"}, r"OTEL_EXPORTER_OTLP_TRACES_HEADERS"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "team=rag,prod"}, r"key=value .* got the item 'prod'"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "=rag"}, r"OTEL_RESOURCE_ATTRIBUTES"),
    ],
)
def test_an_export_setting_the_exporters_would_crash_on_or_drop_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, protocol: str, env: dict[str, str], message: str
) -> None:
    """Audit: with grpc, a timeout that is not a number or an unknown compression (even
    ``none``) raised from the exporter's constructor (a traceback after ``run --check``
    said ok); http fell back to defaults, and both dropped a header item or a resource
    attribute they could not read with a warning: an API key lost, spans refused."""
    _otlp_on(monkeypatch, {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, **env})
    with pytest.raises(ConfigError, match=message) as refused:
        describe_env()
    assert "s3cr" not in str(refused.value)  # header values are secrets
    with pytest.raises(ConfigError, match=message):
        configure_from_env()


def test_an_empty_own_timeout_is_refused_where_the_grpc_exporter_cannot_read_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _otlp_on(monkeypatch, {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": ""})
    assert set(describe_env()) == {"traces", "metrics"}  # http reads it as unset
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(ConfigError, match="TRACES_TIMEOUT is set but empty"):
        describe_env()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "none"},  # the gRPC exporter raised for it
        {"OTEL_EXPORTER_OTLP_COMPRESSION": " GZIP "},
        {  # each signal's own variable wins
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
            "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "none",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "x",
        },
        {"OTEL_EXPORTER_OTLP_TIMEOUT": "2.5", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "30"},
        {"OTEL_EXPORTER_OTLP_TIMEOUT": ""},
        {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc%2C1, x-tenant = a b ,"},
        {"OTEL_RESOURCE_ATTRIBUTES": "team=rag,deployment.environment=prod,"},
    ],
)
def test_export_settings_the_exporters_read_build_both_exporters(
    monkeypatch: pytest.MonkeyPatch, protocol: str, env: dict[str, str]
) -> None:
    _otlp_on(monkeypatch, {"OTEL_EXPORTER_OTLP_PROTOCOL": protocol, **env})
    assert set(describe_env()) == {"traces", "metrics"}
    spans, metrics = telemetry_setup._span_exporter(), telemetry_setup._metric_exporter()
    if protocol == "grpc":  # what the environment says reached the exporter
        timeout = telemetry_setup.export_timeout_s("TRACES")
        assert spans._timeout == pytest.approx(timeout)
        assert metrics._timeout == pytest.approx(telemetry_setup.export_timeout_s("METRICS"))


def test_a_timeout_that_reads_as_milliseconds_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _otlp_on(monkeypatch, {"OTEL_EXPORTER_OTLP_TIMEOUT": "10000"})
    with caplog.at_level("WARNING", logger="sidecar"):
        describe_env()
    assert "read as 10000 seconds" in caplog.text
    assert "would be 10 s" in caplog.text


def test_grpc_takes_a_bare_host_and_port_http_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gRPC exporter dials ``otel-collector:4317`` as it is (TLS unless
    OTEL_EXPORTER_OTLP_INSECURE=true): a configuration that worked keeps starting."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert otlp_endpoint("TRACES") == "otel-collector:4317"
    for bad in ("otel-collector", "otel-collector:99999", "otel-collector:4317/v1", "c:0"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", bad)
        with pytest.raises(ConfigError, match="grpc also takes host:port"):
            otlp_endpoint("TRACES")
    # gRPC targets the exporter hands to its channel as they are (a collector on a Unix
    # socket, DNS resolution): they export, and stopped the start
    for target in ("unix:///run/otel/otlp.sock", "unix:otlp.sock", "dns:///otel-collector:4317"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", target)
        assert otlp_endpoint("TRACES") == target
    for bad in ("unix://", "dns:", "file:///run/otel.sock"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", bad)
        with pytest.raises(ConfigError, match="grpc also takes host:port"):
            otlp_endpoint("TRACES")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "otel-collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    with pytest.raises(ConfigError, match="must be an http:// or https:// URL"):
        otlp_endpoint("TRACES")  # no scheme: the HTTP exporter failed every export
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "unix:///run/otel/otlp.sock")
    with pytest.raises(ConfigError, match="must be an http:// or https:// URL"):
        otlp_endpoint("TRACES")  # the HTTP exporter posts to URLs only


def test_a_signals_own_otlp_endpoint_is_the_one_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://traces.example/v1/traces")
    assert otlp_endpoint("TRACES") == "https://traces.example/v1/traces"
    assert otlp_endpoint("METRICS") == "http://otel-collector:4318"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "collector:4318/v1/metrics")
    with pytest.raises(ConfigError, match=r"^OTEL_EXPORTER_OTLP_METRICS_ENDPOINT must be"):
        otlp_endpoint("METRICS")
    for good in ("http://[::1]:4317", "HTTPS://otel-collector.observability.svc:4317", "http://c"):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", good)
        assert otlp_endpoint("METRICS") == good


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, ("parentbased_always_on", None)),
        ({"OTEL_TRACES_SAMPLER": "always_off"}, ("always_off", None)),
        (
            {"OTEL_TRACES_SAMPLER": "ParentBased_TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
            ("parentbased_traceidratio", 0.1),
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"},
            ("traceidratio", 1.0),
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
            ("traceidratio", 0.0),
        ),
    ],
)
def test_the_traces_sampler_is_read_as_the_sdk_reads_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: tuple[str, float | None]
) -> None:
    for name in ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert traces_sampler() == want


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_TRACES_SAMPLER": "ratio"},
            r"OTEL_TRACES_SAMPLER must be one of always_on, "
            r"always_off, parentbased_always_on, .*parentbased_traceidratio, got 'ratio'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio"},
            r"OTEL_TRACES_SAMPLER_ARG must be a ratio "
            r"in \[0, 1\] for traceidratio .*got None",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"},
            r"OTEL_TRACES_SAMPLER_ARG .* got '10%'",
        ),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, r"got '1.5'"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "nan"}, r"got 'nan'"),
    ],
)
def test_a_sampler_the_sdk_would_not_understand_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """The SDK would warn and record every span; with tracing on, the process stops."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        configure_from_env()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "console"},
            r"OTEL_TRACES_EXPORTER must be one of otlp, "
            r"none, got 'console'$",
        ),
        (
            {"OTEL_METRICS_EXPORTER": "prometheus"},
            r"OTEL_METRICS_EXPORTER must be one of "
            r"otlp, none, got 'prometheus'; Prometheus is served with "
            r"GUARDRAIL_METRICS__PROMETHEUS_PORT",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, r"got 'otlp,console'"),
    ],
)
def test_an_exporter_the_sidecar_does_not_build_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    """The SDK's auto-configuration (which knows those names) is not used: they would
    be ignored without a word."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        describe_env()


def test_otlp_or_none_choose_whether_a_signal_goes_out(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert describe_env().keys() == {"traces", "metrics"}
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "OTLP")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert describe_env().keys() == {"traces"}
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # not read: the SDK is off
    assert describe_env() == {}


def test_a_verdict_is_counted_once_whatever_its_reasons(
    settings_factory: Callable[..., Settings],
) -> None:
    """An allow with no reason and a caveat with three each count once in guardrail.verdicts."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    made = {
        Decision.ALLOW: ["profile.lenient"],
        Decision.CAVEAT: ["profile.strict", "a", "b", "c"],
    }
    for decision, codes in made.items():
        verdict = AnswerVerdict(
            request_id="r",
            idempotency_key="k",
            decision=decision,
            reasons=[Reason(code=c, message=c) for c in codes],
            policy="p/1",
            produced_at=datetime(2026, 1, 1, tzinfo=UTC),
            sidecar_version="0",
        )
        record = TraceRecord("guardrail.request", (), 0, 1, verdict_attributes(verdict))
        out = Output(Destination.VERDICTS, b"r", b"{}", [], trace=record)
        telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    got = points(reader)
    verdicts = {
        (p.attributes["decision"], p.attributes["profile"]): p.value
        for p in got["guardrail.verdicts"]
    }
    assert verdicts == {("allow", "lenient"): 1, ("caveat", "strict"): 1}
    reasons = {p.attributes["reason"]: p.value for p in got["guardrail.verdict.reasons"]}
    assert reasons == {"a": 1, "b": 1, "c": 1}


def test_a_verdict_is_timed_from_its_answers_kafka_timestamp_to_its_confirmation() -> None:
    """stage answer_to_verdict: how long after the final event was written its verdict was
    confirmed; none for an output without the answer's time or replaced by a dead letter."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    now = time.time_ns()
    answered = {
        "written 2 s ago": now - 2_000_000_000,
        "no timestamp": 0,
        "a clock ahead of ours": now + 60_000_000_000,
        # no latency at all (audit): a stamp from 1970, 1990, 2100, 8 days back, 6 min ahead
        "timestamp 1 ms": 1_000_000,
        "1990": 631_152_000_000 * 1_000_000,
        "2100": 4_102_444_800_000 * 1_000_000,
        "8 days back": now - 8 * 86_400 * 1_000_000_000,
        "6 minutes ahead": now + 360_000_000_000,
    }
    for answered_ns in answered.values():
        record = TraceRecord("guardrail.request", (), 0, 1, {}, answered_ns=answered_ns)
        out = Output(Destination.VERDICTS, b"r", b"{}", [], trace=record)
        telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    replaced = Output(
        Destination.VERDICTS, b"r", b"{}", [], trace=TraceRecord("r", (), 0, 1, {}, answered_ns=1)
    )
    dead = Output(Destination.DLQ, b"r", b"{}", [])
    telemetry.after_publish(telemetry.before_publish(replaced, "rag.verdicts"), published=dead)
    [point] = [
        p
        for p in points(reader)["guardrail.stage.duration"]
        if p.attributes["stage"] == "answer_to_verdict"
    ]
    assert point.count == 2  # without a timestamp, replaced, or stamped far off: not timed
    assert 2.0 <= point.max < 2.0 + (time.time_ns() - now) / 1e9 + 1e-3
    assert point.min == 0.0  # the clock ahead of ours


def test_a_step_of_the_wall_clock_does_not_time_a_stage(
    monkeypatch: pytest.MonkeyPatch,
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Stage durations were differences of the wall clock (``time.time_ns``): set back an
    hour (NTP stepping it, a VM resumed) between a request's retrieval and its answer, it
    timed the join at -3,600 s (the histogram's sum went down, read as a counter reset);
    set forward while the verdict waited for the broker, the publish at +3,600 s. Stages
    are timed on the monotonic clock; spans still get wall-clock times."""
    real, hour = time.time_ns, 3_600 * 1_000_000_000
    ahead = [hour]  # the wall clock an hour ahead ...
    monkeypatch.setattr(time, "time_ns", lambda: real() + ahead[0])
    durations = LocalStageDurations(DURATION_BUCKETS_S, description="stages")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(tracer=provider.get_tracer("t"), stage_durations=durations)
    processor = Processor(settings_factory(), PlaceholderPolicy())
    processor.on_message(
        InputKind.RETRIEVAL, dumps(retrieval_event()), None, InputRef("r", 0, 0), 0
    )
    ahead[0] = 0  # ... set right while the answer is generated
    step = processor.on_message(
        InputKind.GENERATION, dumps(final_event()), None, InputRef("g", 0, 0), 0
    )
    [verdict] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    handle = telemetry.before_publish(verdict, "rag.verdicts")
    ahead[0] = hour  # and an hour ahead again while the broker confirms the verdict
    telemetry.after_publish(handle)
    stages = durations.snapshot()
    assert {"join", "certify", "score", "policy", "publish"} <= stages.keys()
    for stage, (counts, total, _) in stages.items():
        assert 0.0 <= total < 60.0, (stage, total)
        assert counts[-1] == 0, stage  # none in +Inf (over 5 s)
    spans = exporter.get_finished_spans()
    [request] = [s for s in spans if s.name == "guardrail.request"]
    children = [s for s in spans if s.name in {f"guardrail.{name}" for name in stages}]
    assert {s.name for s in children} >= {"guardrail.join", "guardrail.policy"}
    assert request.start_time is not None and request.end_time is not None
    for child in children:
        assert child.start_time is not None and child.end_time is not None
        assert request.start_time <= child.start_time <= child.end_time <= request.end_time
    # the spans are on the wall clock as it reads now, not an hour off (a minute's slack)
    assert abs(request.start_time - real()) < 60_000_000_000


def test_a_record_key_in_a_span_is_cut_to_a_request_ids_size() -> None:
    record: ConsumerRecord[bytes, bytes] = ConsumerRecord(
        "t", 0, 7, 0, 0, b"k" * 1_000_000, b"{}", None, 1_000_000, 2, []
    )
    key = _record_attributes(record)["messaging.kafka.message.key"]
    assert key == "k" * MAX_KEY_ATTRIBUTE_BYTES


def test_without_spans_a_verdict_carries_its_inputs_trace_context_or_none() -> None:
    """Untraced, the verdict's headers get the inputs' W3C context as it came; a request
    whose inputs carried none gets no trace header (and keeps the headers it had)."""
    telemetry = Telemetry(spans=False)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for headers, expected in (((("traceparent", parent.encode()),), parent), ((), None)):
        record = TraceRecord("guardrail.request", headers, 0, 1, {})
        out = Output(Destination.VERDICTS, b"r", b"{}", [("x-idempotency-key", b"k")], trace=record)
        telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
        got = dict(out.headers)
        assert got.pop("x-idempotency-key") == b"k"
        assert got == ({} if expected is None else {"traceparent": expected.encode()})


def test_per_key_gauges_are_bounded_and_a_broken_key_is_never_cut() -> None:
    """Audit: 5,000 tenants (the global calibration's per-tenant windows) made 8,197 series,
    a 1.6 MB scrape, and pushed the real keys into the SDK's overflow series."""
    reader = InMemoryMetricReader()
    keyed = KeyedGauges()
    telemetry = Telemetry(
        meter=MeterProvider(metric_readers=[reader]).get_meter("t"), keyed_gauges=keyed
    )
    own = {
        "acme/docs/dense": (0.93, 0.9, 0.95, False),
        "default/nq-open/minilm": (0.9, 0.88, 0.92, False),
    }
    tenants = {f"global[t{i:04d}]": (0.91, 0.8, 0.97, False) for i in range(500)}
    tenants["global[t0450]"] = (0.4, 0.3, 0.5, True)  # the one alarm among them
    telemetry.observe_monitor(lambda: {**tenants, **own}, max_keys=10)
    telemetry.observe_coverage(
        lambda: {k: {"coverage": 0.9, "violated": float(k == "global[t0300]")} for k in tenants},
        max_keys=5,
    )
    got = {**keyed_points(keyed), **points(reader)}  # monitor_keys: on the SDK
    m1 = {p.attributes["calibration_key"] for p in got["guardrail.retrieval.m1_mean"]}
    assert len(m1) == 10
    assert {"global[t0450]", *own} <= m1  # broken first, then the calibrations' own keys
    broken = {
        p.attributes["calibration_key"]: p.value
        for p in got["guardrail.retrieval.exchangeability_broken"]
    }
    assert broken["global[t0450]"] == 1.0
    keys = {
        (p.attributes["exported"], p.attributes["broken"]): p.value
        for p in got["guardrail.retrieval.monitor_keys"]
    }
    assert keys == {("true", "true"): 1, ("true", "false"): 9, ("false", "true"): 0,
                    ("false", "false"): 492}  # fmt: skip
    coverage = {p.attributes["calibration_key"] for p in got["guardrail.coverage.coverage"]}
    assert len(coverage) == 5 and "global[t0300]" in coverage


@pytest.mark.parametrize(
    ("final_parent", "want_parent"),
    [
        (b"00-1bf7651916cd43dd8448eb211c80319d-c7ad6b7169203332-01", "final"),
        (b"garbage", "retrieval"),  # the final's cannot be read: the retrieval's is continued
        (b"00-\xff\xfe-\x80-01", "retrieval"),
    ],
)
def test_a_verdict_continues_a_readable_input_trace_and_links_the_other_half(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    final_parent: bytes,
    want_parent: str,
) -> None:
    """Audit: a retrieval written under another trace than the answer was linked from no
    verdict span, and a final's malformed ``traceparent`` cost the verdict the retrieval's
    readable one (a new root trace)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(tracer=provider.get_tracer("t"))
    processor = Processor(settings_factory(), PlaceholderPolicy())
    retrieval_parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    inputs = [
        (InputKind.RETRIEVAL, dumps(retrieval_event()), ("traceparent", retrieval_parent)),
        (InputKind.GENERATION, dumps(final_event()), ("traceparent", final_parent)),
    ]
    for offset, (kind, raw, header) in enumerate(inputs):
        ref = InputRef("in", 0, offset, (header,))
        for out in processor.on_message(kind, raw, None, ref, 0).outputs:
            telemetry.after_publish(telemetry.before_publish(out, "rag.verdicts"))
    [request] = [s for s in exporter.get_finished_spans() if s.name == "guardrail.request"]
    assert request.parent is not None
    trace_ids = {"retrieval": 0x0AF7651916CD43DD8448EB211C80319C}
    trace_ids["final"] = 0x1BF7651916CD43DD8448EB211C80319D
    assert request.context.trace_id == trace_ids[want_parent]
    linked = {link.context.trace_id for link in request.links}
    if want_parent == "final":  # the retrieval's trace is linked from the verdict
        assert trace_ids["retrieval"] in linked
    else:
        assert linked == set()
