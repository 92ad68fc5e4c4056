"""The loop's background tasks on the real broker: a bug in a tick costs that tick, and a
task that ends before stop() makes the pod not live (restarted, the cause in its log).

Before, a tick that raised anything but a ``KafkaError`` ended the ticker task for good,
silently: no more commits, TTL sweeps, coverage reports or limit reads, while ``/readyz``
and ``/livez`` stayed green.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from sidecar.kafka import app
from sidecar.kafka.readiness import BrokerProbe
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


async def test_a_probe_that_fails_as_it_is_cancelled_is_said_and_stop_completes(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker probe raised as the ticker cancelled it at stop: the error went out of the
    ticker's ``finally`` and out of ``stop()`` (its ``suppress(CancelledError)`` let it
    through), leaving the final commit and the clients' close undone."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    probing = asyncio.Event()

    async def probe_failing_at_cancel(*_: object) -> None:
        probing.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("a bug in the probe's cleanup") from None

    monkeypatch.setattr(BrokerProbe, "run", probe_failing_at_cancel)
    with caplog.at_level(logging.ERROR, logger="sidecar.kafka.app"):
        async with real_harness(settings) as h:
            await wait_until(probing.is_set, 10, "the probe to run")
        # stop() raised RuntimeError before the commit
        assert h.service.stop_step not in ("stopping the ticker", None)
    said = [r for r in caplog.records if r.getMessage() == "the sidecar-broker-probe task ended"]
    assert len(said) == 1 and "a bug in the probe's cleanup" in str(said[0].exc_info)


async def test_stop_under_a_timeout_ends_at_it_while_a_task_ignores_its_cancellation(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``with suppress(CancelledError): await task`` absorbed the cancellation of stop()
    itself: the grace period around it (``asyncio.timeout``) waited for as long as the
    task took, past the kubelet's SIGKILL."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    release, probing = asyncio.Event(), asyncio.Event()

    async def stubborn_probe(*_: object) -> None:
        probing.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # as wait_for on 3.11 could
                await release.wait()

    monkeypatch.setattr(BrokerProbe, "run", stubborn_probe)
    async with real_harness(settings) as h:
        await wait_until(probing.is_set, 10, "the probe to run")
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await h.service.stop()
            took = time.monotonic() - started
        finally:
            release.set()  # the harness's own stop() then ends
        assert took < 5.0
