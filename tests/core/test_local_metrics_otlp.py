"""The plain stage histogram over OTLP: the metric the SDK's histogram would have exported.

``LocalMetricsExporter`` adds ``guardrail.stage.duration`` to each export of
the wrapped OTLP exporter, built from ``LocalStageDurations``. Held against the
SDK's own explicit-bucket histogram fed the same records, cumulative and delta.
(The per-key gauges it adds too: ``test_keyed_gauges.py``.)
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
)

from sidecar import __version__
from sidecar.local_metrics_otlp import LocalMetricsExporter, exports_explicit_buckets
from sidecar.stage_durations import (
    DESCRIPTION,
    DURATION_BUCKETS_S,
    INSTRUMENT,
    SCOPE,
    LocalStageDurations,
)

STAGES = ("join", "certify", "score", "policy", "publish")

durations = st.one_of(
    st.sampled_from(DURATION_BUCKETS_S),  # on a bound: that bucket (le)
    st.floats(min_value=0.0, max_value=10.0),
)
records = st.lists(st.tuples(st.sampled_from(STAGES), durations), max_size=60)


class Captured(MetricExporter):
    """An exporter that keeps what it was given."""

    def __init__(
        self,
        temporality: AggregationTemporality = AggregationTemporality.CUMULATIVE,
        aggregation: Aggregation | None = None,
    ) -> None:
        super().__init__(
            preferred_temporality={HistogramInstrument: temporality},
            preferred_aggregation={HistogramInstrument: aggregation} if aggregation else None,
        )
        self.exported: list[tuple[MetricsData, float]] = []
        self.shut = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exported.append((metrics_data, timeout_millis))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shut = True


class Sdk:
    """The SDK's explicit-bucket histogram, read as an OTLP exporter would read it."""

    def __init__(self, temporality: AggregationTemporality) -> None:
        self.reader = InMemoryMetricReader(preferred_temporality={HistogramInstrument: temporality})
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.histogram = self.provider.get_meter(SCOPE, __version__).create_histogram(
            INSTRUMENT,
            unit="s",
            description=DESCRIPTION,
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )

    def metric(self) -> Metric | None:
        data = self.reader.get_metrics_data()
        if data is None:
            return None
        (resource,) = data.resource_metrics
        (scoped,) = resource.scope_metrics
        assert scoped.scope.name == SCOPE
        (metric,) = scoped.metrics
        return metric


def _points(metric: Metric | None) -> dict[str, HistogramDataPoint]:
    if metric is None:
        return {}
    points = metric.data.data_points
    return {str(p.attributes["stage"]): p for p in points}  # type: ignore[index, misc]


def _assert_same(ours: Metric | None, sdk: Metric | None) -> None:
    if sdk is None or not sdk.data.data_points:
        assert ours is None
        return
    assert ours is not None
    assert (ours.name, ours.unit, ours.description) == (sdk.name, sdk.unit, sdk.description)
    assert ours.data.aggregation_temporality == sdk.data.aggregation_temporality  # type: ignore[union-attr]
    got, want = _points(ours), _points(sdk)
    assert got.keys() == want.keys()
    for stage, point in want.items():
        mine = got[stage]
        assert tuple(mine.bucket_counts) == tuple(point.bucket_counts), stage
        assert tuple(mine.explicit_bounds) == tuple(point.explicit_bounds), stage
        assert mine.count == point.count, stage
        assert mine.sum == pytest.approx(point.sum, rel=1e-9, abs=1e-12), stage
        assert (mine.min, mine.max) == (point.min, point.max), stage


def _feed(batch: Sequence[tuple[str, float]], sdk: Sdk, local: LocalStageDurations) -> None:
    for stage, seconds in batch:
        sdk.histogram.record(seconds, {"stage": stage})
        local.record(stage, seconds)


@settings(max_examples=40, deadline=None)
@given(st.lists(records, min_size=1, max_size=3), st.sampled_from(list(AggregationTemporality)))
def test_each_export_carries_what_the_sdk_histogram_would_have(
    rounds: list[list[tuple[str, float]]], temporality: AggregationTemporality
) -> None:
    """Round after round of records and exports: the same buckets, count, sum, min and
    max per stage, and (delta) no point for a stage not recorded since the last export."""
    if temporality is AggregationTemporality.UNSPECIFIED:
        temporality = AggregationTemporality.CUMULATIVE
    sdk = Sdk(temporality)
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    exporter = LocalMetricsExporter(Captured(temporality), local)
    try:
        for batch in rounds:
            _feed(batch, sdk, local)
            _assert_same(exporter.stage_metric(1), sdk.metric())
    finally:
        sdk.provider.shutdown()


def test_delta_points_start_where_the_last_export_ended() -> None:
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    exporter = LocalMetricsExporter(Captured(AggregationTemporality.DELTA), local)
    local.record("join", 0.001)
    started = _points(exporter.stage_metric(100))["join"]
    local.record("join", 0.002)
    following = _points(exporter.stage_metric(250))["join"]
    assert started.time_unix_nano == 100
    assert (following.start_time_unix_nano, following.time_unix_nano) == (100, 250)
    assert (following.count, following.min, following.max) == (1, 0.002, 0.002)
    assert exporter.stage_metric(300) is None  # nothing recorded since


def test_cumulative_points_keep_the_first_record_as_start_and_fold_min_and_max() -> None:
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    exporter = LocalMetricsExporter(Captured(), local)
    local.record("policy", 0.5)
    first = _points(exporter.stage_metric(10**19))["policy"]
    local.record("policy", 0.25)
    second = _points(exporter.stage_metric(10**19 + 5))["policy"]
    assert first.start_time_unix_nano == second.start_time_unix_nano < 10**19
    assert (second.count, second.min, second.max, second.sum) == (2, 0.25, 0.5, 0.75)
    assert second.time_unix_nano == 10**19 + 5


def _exported_with(data: MetricsData) -> tuple[LocalMetricsExporter, Captured]:
    inner = Captured()
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    exporter = LocalMetricsExporter(inner, local)
    local.record("publish", 0.003)
    assert exporter.export(data, timeout_millis=1234) is MetricExportResult.SUCCESS
    return exporter, inner


def _sdk_data(scope: str) -> MetricsData:
    """What the SDK hands its exporter: one resource, one scope with a counter."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter(scope, "1").create_counter("guardrail.dead_letters").add(1)
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def test_the_stage_histogram_joins_the_sidecars_scope_in_the_export() -> None:
    data = _sdk_data(SCOPE)
    _, inner = _exported_with(data)
    ((sent, timeout),) = inner.exported
    assert timeout == 1234
    (resource,) = sent.resource_metrics
    assert resource.resource is data.resource_metrics[0].resource
    (scoped,) = resource.scope_metrics
    assert [m.name for m in scoped.metrics] == ["guardrail.dead_letters", INSTRUMENT]
    assert [m.name for m in data.resource_metrics[0].scope_metrics[0].metrics] == [
        "guardrail.dead_letters"
    ]  # the SDK's batch itself is left as it was


def test_the_stage_histogram_gets_its_own_scope_when_the_batch_has_none() -> None:
    _, inner = _exported_with(_sdk_data("someone.else"))
    ((sent, _),) = inner.exported
    scopes = {s.scope.name: s for s in sent.resource_metrics[0].scope_metrics}
    assert scopes.keys() == {"someone.else", SCOPE}
    assert scopes[SCOPE].scope.version == __version__
    assert [m.name for m in scopes[SCOPE].metrics] == [INSTRUMENT]


def test_an_export_without_stage_records_is_passed_on_untouched() -> None:
    inner = Captured()
    exporter = LocalMetricsExporter(
        inner, LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    )
    data = _sdk_data(SCOPE)
    exporter.export(data)
    assert inner.exported[0][0] is data
    assert exporter.force_flush() is True
    exporter.shutdown()
    assert inner.shut


def test_a_failing_stage_histogram_leaves_the_sdks_metrics_going_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = Captured()
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    local.record("join", 0.001)
    exporter = LocalMetricsExporter(inner, local)

    def broken() -> None:
        raise RuntimeError("boom")

    local.snapshot = broken  # type: ignore[assignment, method-assign]
    data = _sdk_data(SCOPE)
    assert exporter.export(data) is MetricExportResult.SUCCESS
    assert inner.exported[0][0] is data
    assert "could not be added" in caplog.text


def test_a_window_that_saw_no_record_exports_no_min_or_max() -> None:
    """A record that raced the min/max window swap: counted, and OTLP gets no min/max
    rather than a made-up one."""
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    exporter = LocalMetricsExporter(Captured(), local)
    local.record("score", 0.004)
    assert local.take_extrema("score") == (0.004, 0.004)  # as if the swap won the race
    metric = exporter.stage_metric(5)
    point = _points(metric)["score"]
    assert point.count == 1
    assert [cast(object, point.min), cast(object, point.max)] == [None, None]
    assert metric is not None
    encoded = encode_metrics(_wrapped(metric))
    sent = encoded.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points[0]
    assert sent.count == 1
    assert not sent.HasField("min") and not sent.HasField("max")


def _wrapped(metric: Metric) -> MetricsData:
    data = _sdk_data(SCOPE)
    first = data.resource_metrics[0]
    scoped = first.scope_metrics[0]
    return MetricsData(
        resource_metrics=[
            type(first)(
                resource=first.resource,
                scope_metrics=[type(scoped)(scope=scoped.scope, metrics=[metric], schema_url="")],
                schema_url="",
            )
        ]
    )


def test_extrema_windows_start_empty_and_restart_when_taken() -> None:
    local = LocalStageDurations(DURATION_BUCKETS_S, description=DESCRIPTION)
    assert local.take_extrema("join") == (math.inf, -math.inf)
    for seconds in (0.3, 0.1, 0.2):
        local.record("join", seconds)
    assert local.take_extrema("join") == (0.1, 0.3)
    assert local.take_extrema("join") == (math.inf, -math.inf)
    local.record("join", 0.7)
    assert local.take_extrema("join") == (0.7, 0.7)


@pytest.mark.parametrize(
    ("aggregation", "explicit"),
    [
        (None, True),
        (ExplicitBucketHistogramAggregation(), True),
        (ExponentialBucketHistogramAggregation(), False),
    ],
)
def test_only_explicit_bucket_exporters_take_the_plain_histogram(
    aggregation: Aggregation | None, explicit: bool
) -> None:
    assert exports_explicit_buckets(Captured(aggregation=aggregation)) is explicit


_SETUP_PROBE = """
import json, socket
from opentelemetry import metrics
from prometheus_client import REGISTRY
from sidecar.telemetry import Telemetry
from sidecar.telemetry_setup import configure_from_env

port = None
if PROMETHEUS:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
setup = configure_from_env(port)
readers = metrics.get_meter_provider()._metric_readers
exporters = [type(getattr(r, "_exporter", r)).__name__ for r in readers]
local, keyed = setup.stage_durations, setup.keyed_gauges
telemetry = Telemetry.from_setup(setup)
print(json.dumps({
    "local": local is not None,
    "exporters": exporters,
    "served": local is not None and local in REGISTRY._collector_to_names,
    "keyed_served": keyed in REGISTRY._collector_to_names,
    "wrapped_local": [local is not None
                      and getattr(getattr(r, "_exporter", None), "local", None) is local
                      for r in readers],
    "wrapped_keyed": [getattr(getattr(r, "_exporter", None), "keyed", None) is keyed
                      for r in readers],
    "telemetry_keyed": keyed is not None and telemetry.keyed_gauges is keyed,
}))
setup.shutdown()
"""


@pytest.mark.parametrize(
    ("aggregation", "prometheus", "want"),
    [
        (
            None,
            False,
            {"local": True, "exporters": ["LocalMetricsExporter"], "served": False},
        ),
        (  # the stage histogram stays on the SDK; the per-key gauges do not
            "base2_exponential_bucket_histogram",
            False,
            {"local": False, "exporters": ["LocalMetricsExporter"], "served": False},
        ),
        (
            None,
            True,
            {
                "local": True,
                "exporters": ["LocalMetricsExporter", "PrometheusMetricReader"],
                "served": True,
            },
        ),
    ],
)
def test_the_sidecars_setup_exports_the_local_metrics_over_otlp(
    aggregation: str | None, prometheus: bool, want: dict[str, object]
) -> None:
    """As ``guardrail run`` configures it (a fresh process: the providers are global)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OTEL_") and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = "http://127.0.0.1:9/v1/metrics"
    if aggregation:
        env["OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION"] = aggregation
    done = subprocess.run(
        [sys.executable, "-c", f"PROMETHEUS = {prometheus}\n{_SETUP_PROBE}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout.splitlines()[-1])
    wrapped, wrapped_keyed = got.pop("wrapped_local"), got.pop("wrapped_keyed")
    # the per-key gauges: read by the OTLP reader's exporter, served when Prometheus is
    # on, and where the sidecar's Telemetry puts them
    assert got.pop("keyed_served") is prometheus
    assert got.pop("telemetry_keyed") is True
    assert wrapped_keyed[0] is True
    assert got == want
    assert wrapped[0] is want["local"]  # the OTLP reader's exporter reads that histogram
