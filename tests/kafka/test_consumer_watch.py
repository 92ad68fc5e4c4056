"""ConsumerWatch: a consume task that keeps failing makes the loop not live, not a spin;
and a call holding the processor makes it not ready, then not live."""

from __future__ import annotations

import asyncio
import time

import pytest

from sidecar.kafka.readiness import (
    CONSUMER_FAILURE_WINDOW_S,
    CONSUMER_FAILURES_FATAL,
    ConsumerWatch,
    LoopState,
)
from sidecar.pipeline.progress import Progress


def live(state: LoopState) -> bool:
    return state.live


async def failed_tasks(n: int) -> list[asyncio.Task[None]]:
    async def boom() -> None:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    tasks = [asyncio.create_task(boom()) for _ in range(n)]
    await asyncio.wait(tasks)
    return tasks


async def test_repeated_failures_within_the_window_are_fatal_and_the_dead_tasks_go() -> None:
    state = LoopState()
    watch = ConsumerWatch(state, clock=lambda: 100.0)

    async def running() -> None:
        await asyncio.sleep(10)

    alive = asyncio.create_task(running())
    tasks = [*(await failed_tasks(CONSUMER_FAILURES_FATAL - 1)), alive]
    watch.check(tasks)
    assert tasks == [alive]  # the dead ones no longer held
    assert state.consumer_failing is None
    assert state.consumer_failures == CONSUMER_FAILURES_FATAL - 1
    tasks += await failed_tasks(1)
    watch.check(tasks)
    assert not live(state) and "UnicodeDecodeError" in str(state.consumer_failing)
    alive.cancel()


async def test_failures_spread_beyond_the_window_are_not_fatal() -> None:
    state, now = LoopState(), [0.0]
    watch = ConsumerWatch(state, clock=lambda: now[0])
    for _ in range(3 * CONSUMER_FAILURES_FATAL):
        watch.check(await failed_tasks(1))
        now[0] += CONSUMER_FAILURE_WINDOW_S / (CONSUMER_FAILURES_FATAL - 2)
    assert state.live and state.consumer_failures == 3 * CONSUMER_FAILURES_FATAL


async def test_cancelled_and_running_tasks_are_not_failures() -> None:
    state = LoopState()
    task = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    tasks = [task]
    ConsumerWatch(state).check(tasks)
    ConsumerWatch(state).check(None)
    assert tasks == [task] and state.consumer_failures == 0 and state.live


def test_a_call_holding_the_processor_is_not_ready_then_not_live() -> None:
    state = LoopState(processing_stall_s=30.0, processing_fatal_s=120.0)

    def held(seconds: float | None) -> tuple[bool, bool, bool]:
        """(ready as far as processing goes, wedged, live) with a call out that long."""
        state.processing_since = None if seconds is None else time.monotonic() - seconds
        return state.processing, state.processor_wedged, state.live

    assert held(None) == (True, False, True)  # idle
    assert held(29.0) == (True, False, True)
    assert held(31.0) == (False, False, True)
    assert held(121.0) == (False, True, False)
    assert held(None) == (True, False, True)  # the call returned
    # a long batch that keeps progressing (claims verified request by request) is fine
    state.progress = Progress()
    state.progress.at = time.monotonic() - 5.0
    assert held(500.0) == (True, False, True)
    state.progress.at = time.monotonic() - 200.0  # ... until its beats stop
    assert held(500.0) == (False, True, False)


def test_the_processing_limits_must_be_in_order() -> None:
    from sidecar.config import Settings
    from sidecar.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"PROCESSING_FATAL_S .* must be at least"):
        Settings.load(http={"processing_stall_s": 60.0, "processing_fatal_s": 30.0})
    with pytest.raises(ConfigError, match="PROCESSING_STALL_S: Input should be a finite number"):
        Settings.load(http={"processing_stall_s": float("nan")})
