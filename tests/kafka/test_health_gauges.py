"""``guardrail.ready`` and ``guardrail.live``: what ``/readyz`` and ``/livez`` answer, scraped.

Before, the sidecar exported no readiness or liveness metric: an operator read it from
kube-state-metrics, which shows nothing where the probes are off (inject mode with
``probes.readiness.enabled: false``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from sidecar.runtime import _Started
from sidecar.telemetry import Telemetry


@pytest.fixture
def registry() -> Iterator[tuple[CollectorRegistry, MeterProvider]]:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    yield registry, provider
    provider.shutdown()


@pytest.mark.parametrize("requires_assignment", [True, False])
def test_the_ready_and_live_gauges_follow_the_probes(
    registry: tuple[CollectorRegistry, MeterProvider], requires_assignment: bool
) -> None:
    scraped, provider = registry
    settings = Settings.load(
        http={"enabled": False, "ready_requires_assignment": requires_assignment}
    )
    service = SidecarService(
        settings,
        Processor(settings, PlaceholderPolicy()),
        telemetry=Telemetry(meter=provider.get_meter("t")),
    )
    sidecar = _Started(settings)  # what the health endpoints answer

    def gauges() -> tuple[float, float]:
        text = generate_latest(scraped).decode()
        values = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        return values["guardrail_ready"], values["guardrail_live"]

    def probes() -> tuple[float, float]:
        return float(all(sidecar.readiness().values())), float(all(sidecar.liveness().values()))

    assert gauges() == probes() == (0.0, 1.0)  # starting: live, not ready
    state = service.state
    state.started, state.broker_ok = True, True
    sidecar.service = service
    assert gauges() == probes() == ((0.0, 1.0) if requires_assignment else (1.0, 1.0))
    state.group_joined = True  # the group gave this member its (possibly empty) assignment
    assert gauges() == probes() == (1.0, 1.0)
    state.broker_ok = False  # the metadata probe lost the broker
    assert gauges() == probes() == (0.0, 1.0)
    state.broker_ok = True
    assert gauges() == probes() == (1.0, 1.0)
    state.fail("the topic rag.verdicts does not exist (for 30s)")  # not live, nor ready
    assert gauges() == probes() == (0.0, 0.0)
