"""Fault scenarios: sidecar restarts (SIGKILL, SIGTERM), broker restart, network stall, bad input.

Each scenario uses fresh topics and a fresh consumer group, drives traffic,
injects one kind of fault, then drains and counts, per request id, what came
out: verdicts (and duplicates) and dead letters.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import hostile_corpus, request_records
from sidecar.lab.chaos.harness import Chaos
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.chaos.proxy import ProxyStats, ThrottlingProxy
from sidecar.lab.chaos.watch import Outputs, ScenarioResult, Watch, score_requests
from sidecar.lab.replay import Record, send

# network-stall: the sidecar's link to the broker turns slow, stops, then comes back.
STALL_LATENCY_MS = 50.0  # added to every chunk, both directions
STALL_RATE_BYTES_PER_S = 256 * 1024  # per direction, all of the sidecar's connections together
STALL_S = 12.0
STALL_RATE_PER_S = 25.0  # requests per second, sent straight to the broker all along
# The sidecar's defaults (request timeout 30 s, session timeout 10 s) admit no stall that
# times requests out yet keeps the group member. This scenario's sidecar gets a 5 s request
# timeout, so the requests caught by the 12 s stall time out: aiokafka closes the
# connection, reconnects through the proxy (the new connection's handshake times out too,
# then succeeds after the resume) and retries; the idempotent producer retries its batch
# (a batch that expired would go back through the sidecar's own publish retry). The session
# timeout goes to 30 s, above the stall plus a heartbeat interval (3 s) plus the reconnect,
# so the group keeps its member: no rebalance, the recovery is the reconnect path alone.
# The join TTL is the default 30 s (the suite's 3 s would evict requests split by the stall).
STALL_REQUEST_TIMEOUT_MS = 5_000
STALL_SESSION_TIMEOUT_MS = 30_000
STALL_JOIN_TTL_MS = 30_000


async def _readiness_becomes(
    side: SidecarProcess, ready: bool, within_s: float, every_s: float = 0.25
) -> float | None:
    """Seconds until ``/readyz`` says ``ready``, polled; None if not within ``within_s``."""
    since = time.monotonic()
    while (elapsed := time.monotonic() - since) < within_s:
        if await asyncio.to_thread(side.ready) == ready:
            return elapsed
        await asyncio.sleep(every_s)
    return None


@dataclass
class _StallTimeline:
    """The network-stall scenario's fault sequence and what was seen along it."""

    slow_s: float
    stall_s: float
    ready_before: bool = False
    went_down: float | None = None  # seconds into the stall when /readyz turned false
    came_back: float | None = None  # seconds after the resume when /readyz turned true
    proxy: list[ProxyStats] = field(default_factory=list)  # slow start, stall, resume

    async def run(self, proxy: ThrottlingProxy, side: SidecarProcess) -> float:
        """Slow phase, stall, resume; returns ``time.monotonic()`` at the resume."""
        self.proxy.append(proxy.stats())
        await asyncio.sleep(self.slow_s)
        self.ready_before = await asyncio.to_thread(side.ready)
        self.proxy.append(proxy.stats())
        proxy.stall()
        stalled_at = time.monotonic()
        self.went_down = await _readiness_becomes(side, False, within_s=self.stall_s)
        await asyncio.sleep(max(0.0, stalled_at + self.stall_s - time.monotonic()))
        self.proxy.append(proxy.stats())
        proxy.resume()
        resumed_at = time.monotonic()
        self.came_back = await _readiness_becomes(side, True, within_s=30.0)
        return resumed_at

    def notes(self, sidecar_log: str) -> list[str]:
        slow_from, at_stall, at_resume = self.proxy
        carried = {
            d: round((at_stall.bytes[d] - slow_from.bytes[d]) / self.slow_s / 1024, 1)
            for d in at_stall.bytes
        }
        down = f"{self.went_down:.1f} s into the stall" if self.went_down is not None else "never"
        back = (
            f"{self.came_back:.1f} s after the resume"
            if self.came_back is not None
            else "not within 30 s"
        )
        return [
            f"link: +{STALL_LATENCY_MS:.0f} ms per chunk, cap {STALL_RATE_BYTES_PER_S // 1024} "
            f"KiB/s per direction; the {self.slow_s:.0f} s slow phase carried {carried} KiB/s",
            f"stall {self.stall_s:.0f} s; sidecar request timeout {STALL_REQUEST_TIMEOUT_MS} ms, "
            f"session timeout {STALL_SESSION_TIMEOUT_MS} ms; ready before the stall: "
            f"{self.ready_before}",
            f"readiness false: {down}; ready again: {back}",
            "connections opened through the proxy during the stall (reconnects): "
            f"{at_resume.connections - at_stall.connections} (in all: {at_resume.connections})",
            f"sidecar log: {sidecar_log.count('RequestTimedOutError')} request timeouts, "
            f"{sidecar_log.count('marking coordinator dead')} coordinator losses, "
            f"{sidecar_log.count('retrying in')} publish retries of its own",
        ]


async def restarts(chaos: Chaos, sig: signal.Signals, kills: int = 3) -> ScenarioResult:
    """Traffic flows while the sidecar is stopped with ``sig`` at random moments."""
    name = "sigkill-restart" if sig == signal.SIGKILL else "sigterm-restart"
    result = ScenarioResult(name)
    started = time.monotonic()
    settings, env = chaos.settings()
    await create_topics(settings)
    n = 150 if chaos.quick else 3000
    ids = [f"{name}-{i}" for i in range(n)]
    records = [r for rid in ids for r in request_records(settings.topics, rid)]
    current = [chaos.sidecar(env, f"{name}-0")]
    current[0].start()
    watch = Watch(settings, lambda: current)

    async def killer() -> None:
        span = n / 50.0  # the traffic below lasts about this long
        for i in range(kills):
            await asyncio.sleep(chaos.rng.uniform(0.2, span / kills))
            await asyncio.to_thread(current[0].signal, sig)
            nxt = chaos.sidecar(env, f"{name}-{i + 1}")
            await asyncio.to_thread(nxt.start)
            current[0] = nxt

    expected = set(ids)

    def finished(o: Outputs) -> bool:
        done = expected <= {v["request_id"] for v in o.verdicts}
        return done and time.monotonic() - started > n / 50.0 + 3

    watcher = asyncio.create_task(watch.run(finished, 120))
    kill_task = asyncio.create_task(killer())
    result.sent = await send(settings, records, rate_per_s=200.0)
    await kill_task
    await watcher
    await asyncio.sleep(2.0)  # late duplicates, if any
    await asyncio.to_thread(current[0].signal, signal.SIGTERM)
    tail = Watch(settings, lambda: [])
    await tail.run(lambda o: False, 3.0)
    result.requests = n
    score_requests(result, expected, tail.out)
    result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
    result.seconds = round(time.monotonic() - started, 1)
    return result


async def broker_restart(chaos: Chaos) -> ScenarioResult:
    """The broker stops mid-stream and comes back on the same data directory."""
    result = ScenarioResult("broker-restart")
    started = time.monotonic()
    settings, env = chaos.settings()
    await create_topics(settings)
    n = 100 if chaos.quick else 2000
    ids = [f"br-{i}" for i in range(n)]
    half = n // 2
    side = chaos.sidecar(env, "broker-restart")
    side.start()
    first = [r for rid in ids[:half] for r in request_records(settings.topics, rid)]
    second = [r for rid in ids[half:] for r in request_records(settings.topics, rid)]
    result.sent = await send(settings, first, rate_per_s=200.0)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(chaos.broker.stop)
    not_ready = False
    for _ in range(40):  # up to 10 s of outage while watching readiness
        await asyncio.sleep(0.25)
        not_ready = not_ready or not side.ready()
    await asyncio.to_thread(chaos.broker.start)
    result.notes.append(f"readiness went false during the outage: {not_ready}")
    result.not_ready_during_outage = not_ready
    result.sent += await send(settings, second, rate_per_s=200.0)
    watch = Watch(settings, lambda: [side])
    expected = set(ids)
    await watch.run(lambda o: expected <= {v["request_id"] for v in o.verdicts}, 90)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(side.signal, signal.SIGTERM)
    result.requests = n
    score_requests(result, expected, watch.out)
    result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
    result.seconds = round(time.monotonic() - started, 1)
    return result


async def network_stall(chaos: Chaos, stall_s: float = STALL_S) -> ScenarioResult:
    """The sidecar's network turns slow (latency, a bandwidth cap), stalls, then recovers.

    Only the sidecar crosses the proxy (it bootstraps on the broker's PROXIED
    listener); the load generator and the watcher go straight to the broker,
    so input keeps arriving during the stall and the lag builds up. Readiness
    is polled throughout; ``recovery_s`` is from the resume to the last verdict.
    """
    result = ScenarioResult("network-stall")
    started = time.monotonic()
    settings, env = chaos.settings()
    proxied = chaos.broker.proxied_bootstrap_servers
    assert proxied is not None  # noqa: S101 - Chaos builds its broker with the listener
    env |= {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": proxied,
        "GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS": str(STALL_REQUEST_TIMEOUT_MS),
        "GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS": str(STALL_SESSION_TIMEOUT_MS),
        "GUARDRAIL_JOIN__TTL_MS": str(STALL_JOIN_TTL_MS),
    }
    await create_topics(settings)
    line = _StallTimeline(slow_s=10.0 if chaos.quick else 60.0, stall_s=stall_s)
    n = int(STALL_RATE_PER_S * (line.slow_s + stall_s))
    ids = [f"stall-{i}" for i in range(n)]
    records = [r for rid in ids for r in request_records(settings.topics, rid)]
    expected = set(ids)
    side = chaos.sidecar(env, "network-stall")
    proxy = chaos.proxy
    proxy.set_latency(STALL_LATENCY_MS)
    proxy.set_rate(STALL_RATE_BYTES_PER_S)
    try:
        await asyncio.to_thread(side.start)
        watch = Watch(settings, lambda: [side])
        watcher = asyncio.create_task(
            watch.run(
                lambda o: expected <= {v["request_id"] for v in o.verdicts},
                line.slow_s + stall_s + 90,
            )
        )
        sender = asyncio.create_task(
            send(settings, records, rate_per_s=STALL_RATE_PER_S * len(records) / n)
        )
        resumed_at = await line.run(proxy, side)
        result.sent = await sender
        await watcher
        if expected <= {v["request_id"] for v in watch.out.verdicts}:
            result.recovery_s = round(max(0.0, watch.out.last_verdict_at - resumed_at), 1)
        await asyncio.sleep(2.0)  # late duplicates, if any
        await asyncio.to_thread(side.signal, signal.SIGTERM)
    finally:
        proxy.resume()
        proxy.set_latency(0)
        proxy.set_rate(None)
    tail = Watch(settings, lambda: [])
    await tail.run(lambda o: False, 3.0)
    result.requests = n
    score_requests(result, expected, tail.out)
    result.not_ready_during_outage = line.went_down is not None
    result.ready_after_outage = line.came_back is not None
    result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
    result.notes += line.notes(side.tail(100_000_000))
    result.seconds = round(time.monotonic() - started, 1)
    return result


async def bad_input(chaos: Chaos) -> ScenarioResult:
    """Every hostile message goes to the DLQ or yields a verdict; serving goes on."""
    result = ScenarioResult("bad-input")
    started = time.monotonic()
    settings, env = chaos.settings()
    await create_topics(settings)
    side = chaos.sidecar(env, "bad-input")
    side.start()
    cases = hostile_corpus(settings.topics)
    records: list[Record] = [r for c in cases for r in c.records]
    valid = [f"ok-{i}" for i in range(20)]
    records += [r for rid in valid for r in request_records(settings.topics, rid)]
    result.sent = await send(settings, records)
    expected = set(valid) | {c.verdict_for for c in cases if c.verdict_for}
    want_dlq = sum(c.dead_letters for c in cases)
    watch = Watch(settings, lambda: [side])
    await watch.run(
        lambda o: (
            expected <= {v["request_id"] for v in o.verdicts}
            and sum(o.dlq_reasons.values()) >= want_dlq
        ),
        60,
    )
    alive = side.pid is not None and side.ready()
    result.notes.append(f"sidecar alive and ready after the corpus: {alive}")
    if not alive:
        result.lost += 1
    await asyncio.to_thread(side.signal, signal.SIGTERM)
    result.requests = len(expected)
    score_requests(result, expected, watch.out)
    result.lost += max(0, want_dlq - result.dlq)
    result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
    result.seconds = round(time.monotonic() - started, 1)
    return result
