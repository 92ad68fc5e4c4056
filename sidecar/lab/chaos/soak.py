"""The soak: sustained load with half-requests, oversize and poison records; memory stays flat."""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sidecar.exceptions import ConfigError
from sidecar.lab.chaos.harness import Chaos
from sidecar.lab.chaos.hostile import HostileFactory
from sidecar.lab.chaos.progress import (
    PendingSampler,
)
from sidecar.lab.chaos.tracked import Tracked, log_errors, settle, wedge
from sidecar.lab.chaos.watch import ScenarioResult, Watch
from sidecar.lab.localkafka.broker import default_home
from sidecar.lab.replay import Record, send


@dataclass(frozen=True, slots=True)
class SoakPlan:
    """What ``guardrail chaos --soak`` runs (fractions are of requests)."""

    minutes: float
    rate: float  # requests per second
    half_fraction: float = 0.1  # ordinary requests whose final never comes
    max_entries: int = 2_000
    oversize_fraction: float = 0.0  # over the message limit or the request byte budget
    poison_fraction: float = 0.0  # a hostile case (absurd numbers, bad bytes, ids, tenancy)
    join_max_bytes: int = 16 * 1024 * 1024
    rss_factor: float = 3.0  # RSS budget: baseline + rss_factor x join_max_bytes

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be in [0, 1], got {value}"
            for name, value in (
                ("half_fraction", self.half_fraction),
                ("oversize_fraction", self.oversize_fraction),
                ("poison_fraction", self.poison_fraction),
                (
                    "oversize_fraction + poison_fraction",
                    self.oversize_fraction + self.poison_fraction,
                ),
            )
            if not 0.0 <= value <= 1.0
        ]
        problems += [
            f"{name} must be > 0, got {value}"
            for name, value in (
                ("minutes", self.minutes),
                ("rate", self.rate),
                ("max_entries", self.max_entries),
                ("rss_factor", self.rss_factor),
            )
            if not value > 0
        ]
        if self.join_max_bytes < 65_536:
            problems.append(f"join_max_bytes must be >= 65536, got {self.join_max_bytes}")
        if problems:
            raise ConfigError("soak: " + "; ".join(problems))


def _memory(rss: list[tuple[float, float]], baseline: float, plan: SoakPlan) -> dict[str, Any]:
    """First- and last-minute RSS, and whether every sample stayed within the budget."""
    if not rss:
        return {"baseline_mb": round(baseline, 1), "samples": 0, "within_budget": False}
    end = rss[-1][0]
    first = max(v for t, v in rss if t <= 60)
    last = max(v for t, v in rss if t >= end - 60)
    peak = max(v for _, v in rss)
    budget = baseline + plan.rss_factor * plan.join_max_bytes / 2**20
    return {
        "baseline_mb": round(baseline, 1),
        "join_max_bytes": plan.join_max_bytes,
        "rss_factor": plan.rss_factor,
        "budget_mb": round(budget, 1),
        "first_minute_max_mb": round(first, 1),
        "last_minute_max_mb": round(last, 1),
        "peak_mb": round(peak, 1),
        "per_minute_max_mb": [
            round(max(v for t, v in rss if m * 60 <= t < (m + 1) * 60), 1)
            for m in range(int(end // 60) + 1)
            if any(m * 60 <= t < (m + 1) * 60 for t, _ in rss)
        ],
        "samples": len(rss),
        "within_budget": peak <= budget,
    }


async def soak(chaos: Chaos, plan: SoakPlan) -> ScenarioResult:
    """Sustained load with half-requests, oversize and poison records: memory stays flat.

    A ``half_fraction`` of ordinary requests never send their final event; they sit
    in the join store until the TTL evicts them (``block``/``incomplete``). An
    ``oversize_fraction`` of the requests is over the message limit or over the
    request byte budget, a ``poison_fraction`` is a hostile case (``hostile.py``).
    RSS is sampled every second; the first and the last minute of traffic are
    compared, and every sample with the budget: the RSS measured once the sidecar
    is ready plus ``rss_factor`` times ``GUARDRAIL_JOIN__MAX_BYTES``.
    """
    result = ScenarioResult("soak")
    started = time.monotonic()
    settings, join, side, factory = await chaos.hostile_sidecar(
        "soak",
        {
            "GUARDRAIL_JOIN__MAX_BYTES": str(plan.join_max_bytes),
            "GUARDRAIL_JOIN__MAX_ENTRIES": str(plan.max_entries),
            "GUARDRAIL_JOIN__TTL_MS": "5000",
        },
    )
    await asyncio.sleep(2.0)
    baseline = side.rss_mb() or 0.0
    tracked = Tracked(factory, keep_values=False)
    n = int(plan.rate * plan.minutes * 60)
    rss: list[tuple[float, float]] = []
    traffic_from = time.monotonic()

    async def sample() -> None:
        while True:
            value = side.rss_mb()
            if value is not None:
                rss.append((time.monotonic() - traffic_from, value))
            await asyncio.sleep(1.0)

    rss_task = asyncio.create_task(sample())
    watch = Watch(settings, lambda: [side], sample_lag=False)
    done = asyncio.Event()
    watcher = asyncio.create_task(watch.run(lambda o: done.is_set(), plan.minutes * 60 + 300))
    sampler = PendingSampler(settings)
    sampling = asyncio.create_task(sampler.run())
    try:
        records = _soak_records(chaos, plan, factory, tracked, n)
        result.sent = await send(settings, records, rate_per_s=plan.rate * 3.5)
        await settle(tracked, watch.out, sampler, since=time.monotonic(), timeout_s=120.0)
        await asyncio.sleep(1.0)
    finally:
        rss_task.cancel()
        sampler.stop()
        await sampling
        done.set()
        await watcher
    await asyncio.to_thread(side.signal, signal.SIGTERM)
    tracked.score(result, watch.out, committed_all=sampler.pending == 0, exactly_one=False)
    result.requests = len(tracked.ordinary_ids)
    result.wedged_s = wedge(result, sampler, watch.out, join)
    result.peak_rss_mb = watch.peak_rss_mb
    result.max_lag = max((lag for _, lag in sampler.samples), default=0)
    result.memory = _memory(rss, baseline, plan)
    incomplete = sum(
        1 for v in watch.out.verdicts if any(r["code"] == "incomplete" for r in v["reasons"])
    )
    m = result.memory
    result.notes += [
        f"rss first minute max {m['first_minute_max_mb']} MB, last minute max "
        f"{m['last_minute_max_mb']} MB; budget {m['budget_mb']} MB = baseline "
        f"{m['baseline_mb']} MB + {plan.rss_factor} x join max_bytes "
        f"{plan.join_max_bytes} B; within: {m['within_budget']}",
        f"incomplete verdicts (evicted half-requests): {incomplete}",
        log_errors(side),
    ]
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _soak_records(
    chaos: Chaos, plan: SoakPlan, factory: HostileFactory, tracked: Tracked, n: int
) -> Iterator[Record]:
    """The soak's traffic, built as it is sent (nothing large is kept)."""
    recent: deque[str] = deque(maxlen=8)
    decided_after = int(plan.rate * 20)  # a request this many slots back is decided
    hostile = plan.oversize_fraction + plan.poison_fraction
    for i in range(n):
        draw = chaos.rng.random()
        if draw < plan.oversize_fraction:
            yield from tracked.add(factory.oversize(f"s{i}-"))
        elif (
            draw < hostile
            and len(tracked.ordinary_ids) >= decided_after
            and chaos.rng.random() < 0.2
        ):
            old = tracked.ordinary_ids[-decided_after]  # a late re-send
            yield from tracked.add(factory.late_resends("late-resend", factory.ordinary(old)))
        elif draw < hostile:
            victims = list(recent)  # each victim id is used by one poison case only
            recent.clear()
            yield from tracked.add(factory.poison(f"s{i}-", victims))
        else:
            rid = f"soak-{i}"
            yield from tracked.ordinary(rid, drop_final=chaos.rng.random() < plan.half_fraction)
            recent.append(rid)


def run_soak(plan: SoakPlan, seed: int = 7) -> dict[str, Any]:
    """The soak against its own broker: the plan and the one scenario result."""
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="soak-", dir=home) as tmp,
        Chaos(Path(tmp), seed, quick=False) as chaos,
    ):
        result = asyncio.run(soak(chaos, plan))
    return {"plan": asdict(plan), "scenarios": [asdict(result)]}
