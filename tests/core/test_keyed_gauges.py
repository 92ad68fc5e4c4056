"""The per-calibration-key gauges, read outside the SDK at scrape and export time.

Held against what the SDK's observable gauges exported for the same inputs (the
Prometheus page, line for line, and the OTLP metrics), and against the SDK's
lifetime limit of 2,000 attribute sets per instrument, which hid which key broke
once tenants had come and gone (audit).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Metric, MetricsData
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar import __version__
from sidecar.keyed_gauges import KeyedGauges
from sidecar.local_metrics_otlp import LocalMetricsExporter, keyed_gauge_metrics
from sidecar.stage_durations import SCOPE
from sidecar.telemetry import Telemetry
from sidecar.telemetry_setup import _SCOPE_LABELS
from tests.core.test_local_metrics_otlp import Captured, _sdk_data

Statuses = dict[str, tuple[float, float, float, bool]]
Reports = dict[str, dict[str, float | None]]


def served() -> tuple[Telemetry, CollectorRegistry, MeterProvider]:
    """A Telemetry on the page ``guardrail run`` serves: the SDK's Prometheus exporter and
    the per-key gauges in one registry (as ``configure_from_env`` puts them in its own)."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    keyed = KeyedGauges(_SCOPE_LABELS)
    registry.register(keyed)
    telemetry = Telemetry(meter=provider.get_meter(SCOPE, __version__), keyed_gauges=keyed)
    return telemetry, registry, provider


def samples(registry: CollectorRegistry, name: str) -> list[dict[str, Any]]:
    text = generate_latest(registry).decode()
    return [
        {**s.labels, "value": s.value}
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


def otlp_points(metrics: Iterable[Metric]) -> dict[str, dict[str, tuple[float, int | None]]]:
    """Per gauge: its value and start time per calibration key."""
    out: dict[str, dict[str, tuple[float, int | None]]] = {}
    for metric in metrics:
        assert isinstance(metric.data, Gauge), metric.name
        values = out[metric.name] = {}
        for point in metric.data.data_points:
            assert dict(point.attributes or {}).keys() == {"calibration_key"}
            values[str((point.attributes or {})["calibration_key"])] = (
                point.value,
                point.start_time_unix_nano,
            )
    return out


def test_a_key_that_breaks_after_tenant_turnover_keeps_its_own_series() -> None:
    """3,000 tenants' keys come and go, 100 a scrape; then a new key breaks. The SDK had
    kept every key it saw and put this one in ``otel_metric_overflow="true"``: the alert
    could not say which key broke."""
    telemetry, registry, provider = served()
    current: Statuses = {}
    telemetry.observe_monitor(lambda: dict(current))
    for scrape in range(30):
        current.clear()
        current.update(
            {f"global[t{scrape:02d}-{i:03d}]": (0.9, 0.85, 0.95, False) for i in range(100)}
        )
        assert len(samples(registry, "guardrail_retrieval_m1_mean")) == 100
    current.clear()
    current["global[late-tenant]"] = (0.4, 0.3, 0.5, True)
    broken = samples(registry, "guardrail_retrieval_exchangeability_broken")
    assert broken == [{**_SCOPE_LABELS, "calibration_key": "global[late-tenant]", "value": 1.0}]
    assert "otel_metric_overflow" not in generate_latest(registry).decode()
    assert telemetry.keyed_gauges is not None
    otlp = otlp_points(keyed_gauge_metrics(telemetry.keyed_gauges, 1))
    assert otlp["guardrail.retrieval.exchangeability_broken"] == {
        "global[late-tenant]": (1.0, None)
    }
    provider.shutdown()


def monitor_inputs() -> tuple[Statuses, Reports]:
    """More keys than a scrape takes, a broken and a violated one, an odd key, a gauge
    without a value."""
    statuses: Statuses = {
        f"global[t{i:03d}]": (0.91, 0.8 + i / 1000, 0.97, False) for i in range(150)
    }
    statuses["global[t120]"] = (0.4, 0.3, 0.5, True)
    statuses["acme/docs/dense"] = (0.93, 0.9, 0.95, False)
    statuses['we"ird\\key\nx'] = (0.5, 0.25, 0.75, False)
    reports: Reports = {
        f"k{i}": {"coverage": 0.5 + i / 100, "bound": 0.2, "violated": float(i == 7)}
        for i in range(10)
    }
    reports["sparse"] = {"coverage": 0.5, "bound": None, "violated": 0.0}
    return statuses, reports


def observed(telemetry: Telemetry) -> None:
    statuses, reports = monitor_inputs()
    telemetry.observe_monitor(lambda: statuses)
    telemetry.observe_coverage(lambda: reports, max_keys=3)


def keyed_lines(text: str) -> list[str]:
    return sorted(
        line
        for line in text.splitlines()
        if "guardrail_retrieval_" in line or "guardrail_coverage_" in line
    )


def test_the_page_has_the_lines_the_sdks_exporter_wrote() -> None:
    """Same names, HELP, TYPE, labels (``otel_scope_*`` included) and values as the
    SDK's observable gauges read by its Prometheus exporter: dashboards and alerts hold."""
    sdk_registry = CollectorRegistry()
    sdk = MeterProvider(metric_readers=[PrometheusMetricReader(registry=sdk_registry)])
    observed(Telemetry(meter=sdk.get_meter(SCOPE, __version__)))  # no keyed_gauges: the SDK's
    telemetry, registry, provider = served()
    observed(telemetry)
    want = keyed_lines(generate_latest(sdk_registry).decode())
    assert len(want) > 400
    assert keyed_lines(generate_latest(registry).decode()) == want
    sdk.shutdown()
    provider.shutdown()


def test_otlp_gets_the_gauges_the_sdk_would_have_sent() -> None:
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader])
    observed(Telemetry(meter=sdk.get_meter(SCOPE, __version__)))  # no keyed_gauges: the SDK's
    data = reader.get_metrics_data()
    assert data is not None
    sent = [
        m
        for m in data.resource_metrics[0].scope_metrics[0].metrics
        if m.name != "guardrail.retrieval.monitor_keys"  # stays on the SDK
    ]
    keyed = KeyedGauges()
    observed(Telemetry(meter=MeterProvider().get_meter("t"), keyed_gauges=keyed))
    ours = keyed_gauge_metrics(keyed, 5)
    assert {(m.name, m.description, m.unit) for m in ours} == {
        (m.name, m.description, m.unit) for m in sent
    }
    assert otlp_points(ours) == otlp_points(sent)
    sdk.shutdown()


def test_the_gauges_join_the_sidecars_scope_of_each_otlp_export() -> None:
    """Also when the stage histogram stays on the SDK (no ``local``: the exporter wants
    exponential histograms)."""
    keyed = KeyedGauges()
    keyed.add(
        [("guardrail.retrieval.m1_mean", "d")], lambda: {"guardrail.retrieval.m1_mean": {"k": 0.5}}
    )
    inner = Captured()
    LocalMetricsExporter(inner, None, keyed).export(_sdk_data(SCOPE))
    ((sent, _),) = inner.exported
    (scoped,) = sent.resource_metrics[0].scope_metrics
    assert [m.name for m in scoped.metrics] == [
        "guardrail.dead_letters",
        "guardrail.retrieval.m1_mean",
    ]
    nothing = KeyedGauges()
    data: MetricsData = _sdk_data(SCOPE)
    LocalMetricsExporter(inner, None, nothing).export(data)
    assert inner.exported[1][0] is data  # no key reported: the batch as the SDK made it


def test_a_failing_read_leaves_the_rest_of_the_page(caplog: pytest.LogCaptureFixture) -> None:
    """As the SDK does with a failing callback: that group is left out and logged."""
    telemetry, registry, provider = served()

    def broken() -> Statuses:
        raise RuntimeError("dictionary changed size during iteration")

    def reports() -> Reports:
        return {"k": {"coverage": 0.9}}

    telemetry.observe_monitor(broken)
    telemetry.observe_coverage(reports)
    assert samples(registry, "guardrail_retrieval_m1_mean") == []
    assert [s["value"] for s in samples(registry, "guardrail_coverage_coverage")] == [0.9]
    assert "guardrail.retrieval.m1_mean could not be read" in caplog.text
    provider.shutdown()
