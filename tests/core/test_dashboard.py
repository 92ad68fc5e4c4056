"""The chart's Grafana dashboard queries metrics the sidecar really exposes to Prometheus."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.contracts.events import Decision, FeedbackEvent, RetrievalSignal, SignalStatus
from sidecar.keyed_gauges import KeyedGauges
from sidecar.pipeline.outputs import AttributeValue, Destination, Output, TraceRecord
from sidecar.telemetry import Telemetry

DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "charts"
    / "guardrail-sidecar"
    / "dashboards"
    / "guardrail-sidecar.json"
)
_METRIC = re.compile(r"\bguardrail_[a-z0-9_]+")


def coverage_gauges() -> dict[str, dict[str, float | None]]:
    """A real coverage monitor's gauges, every one with a value (a probe, both strata labelled)."""
    monitor = CoverageMonitor(window=100, report_interval_s=60.0, probe=(100, 5))
    for i in range(4):
        rid = f"r{i}"
        monitor.observe_decision(
            rid,
            Decision.CAVEAT,
            RetrievalSignal(status=SignalStatus.OK, m1=i % 2 == 0, calibration_key="k"),
            None,
        )
        monitor.observe_feedback(FeedbackEvent(request_id=rid, correct=i < 2, source="grader"))
    return monitor.gauge_values()


def exposed_sample_names() -> set[str]:
    """Every sample name the real Prometheus exporter writes for the sidecar's instruments,
    with the per-key gauges in the same registry (as ``configure_from_env`` serves them)."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    keyed = KeyedGauges()
    registry.register(keyed)
    telemetry = Telemetry(meter=provider.get_meter("test"), keyed_gauges=keyed)
    counted: list[tuple[Destination, dict[str, AttributeValue]]] = [
        (
            Destination.VERDICTS,
            {
                "guardrail.decision": "caveat",
                "guardrail.profile": "p",
                "guardrail.stage": "final",
                "guardrail.reasons": ["r"],
            },
        ),
        (Destination.CLAIMS, {"guardrail.claim.label": "supported"}),
    ]
    for destination, attributes in counted:  # verdicts, reasons, claims: counted on publish
        record = TraceRecord("guardrail.request", (), 0, 1, attributes)
        out = Output(destination, b"r", b"{}", [], trace=record)
        telemetry.after_publish(telemetry.before_publish(out, "rag.out"))
    telemetry.dead_letters.add(1, {"reason": "malformed-json"})
    telemetry.stage_durations.record("policy", 0.0005)
    telemetry.publish_retries.add(1)
    telemetry.observe(lambda: 1, lambda: 1, lambda: {("rag.generation", 0): 1})
    telemetry.observe_gauges(
        lambda: {"queue.records": 1, "queue.bytes": 1, "consumer.paused_partitions": 1}
    )
    telemetry.observe_consumed(lambda: {("rag.generation", "accepted"): 1})
    telemetry.observe_gauges(lambda: {"ready": 1, "live": 1})
    telemetry.observe_processor_cpu(lambda: 1.5)
    telemetry.observe_monitor(lambda: {"k": (0.9, 0.8, 0.95, False)})
    telemetry.observe_coverage(coverage_gauges)
    text = generate_latest(registry).decode()
    provider.shutdown()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return found


def test_every_queried_metric_is_exposed() -> None:
    exposed = exposed_sample_names()
    queried = {
        name
        for panel in panels()
        for target in panel["targets"]
        for name in _METRIC.findall(target["expr"])
    }
    assert queried, "the dashboard queries no guardrail_* metric"
    assert queried - exposed == set(), f"exposed: {sorted(exposed)}"


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for needed in (
        "guardrail_verdicts_total",  # verdict mix
        "guardrail_verdict_reasons_total",  # reasons
        "histogram_quantile(0.95, sum by (le, stage) (rate(guardrail_stage_duration_seconds_bucket",
        "guardrail_consumer_lag",
        "guardrail_queue_records",
        "guardrail_consumer_paused_partitions",
        "guardrail_dead_letters_total",
        "guardrail_consumer_records_total",  # intake by topic, the share dead-lettered
        "guardrail_ready",
        "guardrail_coverage_window_requests",  # the fleet bound, from summed counts
        "guardrail_processor_cpu_time_seconds_total",  # deciding's CPU against the loop's
    ):
        assert needed in exprs, needed
    # a ratio, interval or bound of one replica cannot be combined with another's
    for ratio in ("coverage", "bound", "measured_hallucination", "epsilon"):
        for agg in ("max", "avg", "min"):
            assert f"{agg} by (calibration_key) (guardrail_coverage_{ratio}{{" not in exprs
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
