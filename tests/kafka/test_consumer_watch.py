"""ConsumerWatch: a consume task that keeps failing makes the loop not live, not a spin."""

from __future__ import annotations

import asyncio

from sidecar.kafka.readiness import (
    CONSUMER_FAILURE_WINDOW_S,
    CONSUMER_FAILURES_FATAL,
    ConsumerWatch,
    LoopState,
)


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
