"""The loop's background tasks on the real broker: a bug in a tick costs that tick, and a
task that ends before stop() makes the pod not live (restarted, the cause in its log).

Before, a tick that raised anything but a ``KafkaError`` ended the ticker task for good,
silently: no more commits, TTL sweeps, coverage reports or limit reads, while ``/readyz``
and ``/livez`` stayed green.
"""

from __future__ import annotations

import logging

import pytest

from sidecar.kafka import app
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.outputs import Step
from tests.kafka.harness import real_harness, settings_for, wait_until

pytestmark = pytest.mark.connected


async def test_a_tick_that_raises_is_logged_and_the_next_tick_runs(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    async with real_harness(settings) as h:
        processor = h.service.processor
        on_tick, ticks = processor.on_tick, []

        def failing_once(now_ms: float, wall_ms: float | None = None) -> Step:
            ticks.append(now_ms)
            if len(ticks) == 1:
                raise RuntimeError("a bug in the sweep")
            return on_tick(now_ms, wall_ms)

        processor.on_tick = failing_once  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="sidecar.kafka.app"):
            await wait_until(lambda: len(ticks) >= 3, 30, "two ticks after the failing one")
        ticker = h.service._ticker
        assert ticker is not None and not ticker.done()
        assert h.service.state.live and h.service.state.fatal is None
        failed = [r for r in caplog.records if r.getMessage() == "tick failed (will retry)"]
        assert len(failed) == 1 and failed[0].exc_info is not None
        assert "a bug in the sweep" in str(failed[0].exc_info[1])


async def test_a_background_task_that_ends_makes_the_sidecar_not_live(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)

    def broken(*_: object, **__: object) -> int:  # outside the tick's try: ends the task
        raise RuntimeError("a bug outside the tick's guard")

    async with real_harness(settings) as h:
        assert h.service.state.live
        monkeypatch.setattr(app, "report_repeats", broken)
        await wait_until(lambda: not h.service.state.live, 30, "liveness to drop")
        fatal = h.service.state.fatal or ""
        assert "sidecar-ticker" in fatal and "a bug outside the tick's guard" in fatal


async def test_a_broker_probe_that_raises_makes_the_sidecar_not_live(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker probe is the ticker's own task: ended by a bug (anything but the
    ``KafkaError`` and timeout it handles), it ended silently, and ``broker_ok`` kept its
    last value: ready while the broker was gone, and no more missing topics found."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)

    async def broken(*_: object) -> None:
        raise RuntimeError("a bug in the probe")

    async with real_harness(settings) as h:
        assert h.service.state.live
        monkeypatch.setattr(h.service.probe, "probe", broken)
        await wait_until(lambda: not h.service.state.live, 30, "liveness to drop")
        fatal = h.service.state.fatal or ""
        assert "sidecar-broker-probe" in fatal and "a bug in the probe" in fatal
