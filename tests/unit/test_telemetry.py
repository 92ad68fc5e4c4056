from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import (
    AnswerVerdict,
    Decision,
    FeedbackEvent,
    RetrievalSignal,
    Signals,
    SignalStatus,
)
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.telemetry import Telemetry
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
            telemetry.after_publish(telemetry.before_publish(out))
    got = points(reader)
    [verdict] = got["guardrail.verdicts"]
    assert verdict.value == 1
    assert dict(verdict.attributes) == {"decision": "caveat", "reason": "no-signals-configured"}
    [dead] = got["guardrail.dead_letters"]
    assert dict(dead.attributes) == {"reason": "malformed-json"} and dead.value == 1
    stages = {dict(p.attributes)["stage"] for p in got["guardrail.stage.duration"]}
    assert {"join", "certify", "score", "policy"} <= stages
    assert got["guardrail.join.evictions"][0].value == 7
    assert got["guardrail.consumer.lag"][0].value == 3
    assert got["guardrail.join.open_requests"][0].value == 0


def test_coverage_bound_gauges_follow_the_monitor() -> None:
    """Verdicts and feedback through a CoverageMonitor show up as guardrail.coverage.* gauges."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
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
    got = points(reader)
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
