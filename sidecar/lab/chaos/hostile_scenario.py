"""The hostile scenario: ordinary requests interleaved with every class of hostile record."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable

from sidecar.lab.chaos.expectations import (
    Outcome,
)
from sidecar.lab.chaos.harness import Chaos
from sidecar.lab.chaos.hostile import HostileFactory
from sidecar.lab.chaos.progress import (
    PendingSampler,
)
from sidecar.lab.chaos.tracked import Tracked, log_errors, settle, wedge
from sidecar.lab.chaos.watch import ScenarioResult, Watch
from sidecar.lab.replay import Record, send

HOSTILE_RATE_PER_S = 200.0  # records per second
HOSTILE_JOIN_MAX_BYTES = 262_144  # the join flood (half-requests of ~31 KB) crosses it


async def hostile(chaos: Chaos) -> ScenarioResult:
    """Ordinary requests interleaved with every class of hostile record (issue #20).

    Phase 1: ordinary requests, absurd numbers, bad bytes, records at every size
    limit, tricky request ids, another tenant's ids and a flood of labels. Phase 2,
    once the TTL has passed: late re-sends of decided requests, and new ordinary
    requests. Phase 3: half-requests that overflow the join store's byte budget.
    Each phase waits until the group has committed all input. ``wedged_s``: the
    longest interval with input pending and nothing published, if over the
    threshold (``progress.wedge_threshold_s``).
    """
    result = ScenarioResult("hostile")
    started = time.monotonic()
    settings, join, side, factory = await chaos.hostile_sidecar(
        "hostile", {"GUARDRAIL_JOIN__MAX_BYTES": str(HOSTILE_JOIN_MAX_BYTES)}
    )
    tracked = Tracked(factory)
    phases = _phases(chaos, factory, tracked)
    timeout = 60.0 if chaos.quick else 180.0
    watch = Watch(settings, lambda: [side], sample_lag=False)
    done = asyncio.Event()
    watcher = asyncio.create_task(watch.run(lambda o: done.is_set(), 3 * timeout + 60))
    sampler = PendingSampler(settings)
    sampling = asyncio.create_task(sampler.run())
    settled: list[bool] = []
    try:
        for i, phase in enumerate(phases):
            if i == 1:
                await asyncio.sleep(join.ttl_ms / 1000.0 + 0.5)  # decided ids outlive it
            result.sent += await send(settings, phase(), rate_per_s=HOSTILE_RATE_PER_S)
            since = time.monotonic()
            settled.append(
                await settle(tracked, watch.out, sampler, since=since, timeout_s=timeout)
            )
        await asyncio.sleep(1.0)  # late duplicates, if any
    finally:
        sampler.stop()
        await sampling
        done.set()
        await watcher
    alive = side.pid is not None and side.ready()
    if not alive:
        result.lost += 1
    await asyncio.to_thread(side.signal, signal.SIGTERM)
    tracked.score(result, watch.out, committed_all=sampler.pending == 0, exactly_one=True)
    result.requests = len(tracked.ordinary_ids)
    result.wedged_s = wedge(result, sampler, watch.out, join)
    result.notes += [
        f"sidecar alive and ready at the end: {alive}; phases settled: {settled}",
        log_errors(side),
    ]
    result.peak_rss_mb = watch.peak_rss_mb
    result.max_lag = max((lag for _, lag in sampler.samples), default=0)
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _phases(
    chaos: Chaos, factory: HostileFactory, tracked: Tracked
) -> list[Callable[[], list[Record]]]:
    """The hostile scenario's three phases, each built when it is sent."""
    n, labels, resends, flood = (40, 200, 10, 16) if chaos.quick else (400, 5000, 100, 64)
    ids = [f"ok-{i}" for i in range(n)]
    groups = factory.phase_one("h-", victims=ids[n // 2 : n // 2 + 4])

    def first() -> list[Record]:
        label_flood = factory.labels("h-", ids, labels)
        out: list[Record] = []
        for i, rid in enumerate(ids):
            out += tracked.ordinary(rid)
            for group in groups[i * len(groups) // n : (i + 1) * len(groups) // n]:
                out += tracked.add(group)
            out += tracked.add(label_flood[i * labels // n : (i + 1) * labels // n])
        return out

    def second() -> list[Record]:
        out: list[Record] = []
        for i, rid in enumerate(ids[:resends]):
            out += tracked.add(factory.late_resends("late-resend", factory.ordinary(rid)))
            out += tracked.ordinary(f"ok2-{i}")
        answered = [h.record for g in groups for h in g if h.outcome is Outcome.ANSWER]
        return out + tracked.add(factory.late_resends("late-resend-hostile", answered[:resends]))

    def third() -> list[Record]:
        return tracked.add(factory.join_flood("h3-", flood))

    return [first, second, third]
