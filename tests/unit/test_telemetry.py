from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
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
