"""Chaos scenarios against a real broker and the sidecar as its own process.

Each scenario uses fresh topics and a fresh consumer group, drives traffic,
injects one kind of fault, then drains and counts, per request id, what came
out: verdicts (and duplicates, recognised by request id and idempotency key)
and dead letters. ``lost`` counts requests that never got a verdict, plus
hostile messages that reached neither the DLQ nor a verdict.

The broker has one extra listener behind a throttling proxy (``proxy.py``): only
the network-stall scenario's sidecar bootstraps there; every other client (the
load generator, the watcher, the other scenarios' sidecars) uses the direct
PLAINTEXT listener and never crosses the proxy.
"""

from __future__ import annotations

import asyncio
import random
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.chaos.corpus import hostile_corpus, request_records
from sidecar.chaos.process import SidecarProcess
from sidecar.chaos.proxy import ProxyStats, ThrottlingProxy
from sidecar.config import Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.topics import create_topics
from sidecar.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port
from sidecar.replay import Record, send

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


@dataclass
class ScenarioResult:
    name: str
    sent: int = 0  # input messages produced
    requests: int = 0  # requests that must get a verdict
    verdicts: int = 0
    duplicates: int = 0
    lost: int = 0
    dlq: int = 0
    dlq_reasons: dict[str, int] = field(default_factory=dict)
    peak_rss_mb: float = 0.0
    max_lag: int = 0
    seconds: float = 0.0
    key_conflicts: int = 0  # request ids whose verdicts carry more than one idempotency key
    not_ready_during_outage: bool | None = None
    ready_after_outage: bool | None = None
    recovery_s: float | None = None  # from the end of the fault to the last verdict
    notes: list[str] = field(default_factory=list)


@dataclass
class Outputs:
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    dlq_reasons: Counter[str] = field(default_factory=Counter)
    last_verdict_at: float = 0.0  # time.monotonic() when the latest verdict was read


class Watch:
    """Reads the verdict and DLQ topics and samples RSS and lag in the background."""

    def __init__(
        self, settings: Settings, sidecars: Callable[[], Iterable[SidecarProcess]]
    ) -> None:
        self.settings = settings
        self.sidecars = sidecars
        self.out = Outputs()
        self.peak_rss_mb = 0.0
        self.max_lag = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_rss, daemon=True)

    def _sample_rss(self) -> None:
        while not self._stop.wait(0.25):
            for p in self.sidecars():
                rss = p.rss_mb()
                if rss is not None:
                    self.peak_rss_mb = max(self.peak_rss_mb, rss)

    async def run(self, until: Callable[[Outputs], bool], timeout_s: float) -> None:
        t = self.settings.topics
        consumer = AIOKafkaConsumer(
            t.verdicts,
            t.dlq,
            bootstrap_servers=self.settings.kafka.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=32 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        await consumer.start()
        self._sampler.start()
        deadline = time.monotonic() + timeout_s
        next_lag = 0.0
        try:
            while time.monotonic() < deadline and not until(self.out):
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for m in records:
                        if m.topic == t.dlq:
                            headers = dict(m.headers)
                            self.out.dlq_reasons[headers.get("x-dlq-reason", b"?").decode()] += 1
                        else:
                            self.out.verdicts.append(orjson.loads(m.value))
                            self.out.last_verdict_at = time.monotonic()
                if time.monotonic() >= next_lag:
                    self.max_lag = max(self.max_lag, await self._lag())
                    next_lag = time.monotonic() + 1.0
        finally:
            self._stop.set()
            await consumer.stop()

    async def _lag(self) -> int:
        s = self.settings
        admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap_servers)
        probe = AIOKafkaConsumer(bootstrap_servers=s.kafka.bootstrap_servers)
        try:
            await admin.start()
            await probe.start()
            committed = await admin.list_consumer_group_offsets(s.kafka.group_id)
            tps = [TopicPartition(s.topics.retrieval, p) for p in range(s.topics.partitions)]
            tps += [TopicPartition(s.topics.generation, p) for p in range(s.topics.partitions)]
            ends = await probe.end_offsets(tps)
            return sum(
                max(0, end - max(0, committed[tp].offset if tp in committed else 0))
                for tp, end in ends.items()
            )
        except Exception:  # noqa: BLE001 - lag is best effort while the broker is down
            return 0
        finally:
            await probe.stop()
            await admin.close()


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


class Chaos:
    """Owns the broker and runs scenarios, each on fresh topics."""

    def __init__(self, workdir: Path, seed: int = 7, quick: bool = True) -> None:
        self.workdir = workdir
        self.rng = random.Random(seed)  # noqa: S311 - reproducible fault timing
        self.quick = quick
        lib = ensure_jars(default_home() / "lib")
        proxied = free_port()
        self.proxy = ThrottlingProxy(upstream_port=proxied)
        self.broker = LocalKafka(
            workdir / "broker",
            lib,
            port=free_port(),
            controller_port=free_port(),
            proxied_port=proxied,
            proxied_advertised_port=self.proxy.port,
        )
        self._live: list[SidecarProcess] = []

    def __enter__(self) -> Chaos:
        self.proxy.start()
        try:
            self.broker.start()
        except BaseException:
            self.proxy.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for p in self._live:
                if p.pid is not None:
                    p.signal(signal.SIGKILL)
            self.broker.stop()
        finally:
            self.proxy.close()

    # ------------------------------------------------------------------ plumbing

    def _settings(self) -> tuple[Settings, dict[str, str]]:
        suffix = uuid.uuid4().hex[:8]
        topics = {
            n: f"chaos.{suffix}.{n}"
            for n in ("retrieval", "generation", "claims", "verdicts", "dlq", "feedback", "reports")
        }
        settings = Settings.load(
            kafka={
                "bootstrap_servers": self.broker.bootstrap_servers,
                "group_id": f"chaos.{suffix}",
            },
            topics={**topics, "partitions": 3},
        )
        env = {
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "GUARDRAIL_KAFKA__GROUP_ID": f"chaos.{suffix}",
            "GUARDRAIL_JOIN__TTL_MS": "3000",
            "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "200",
            **{f"GUARDRAIL_TOPICS__{n.upper()}": v for n, v in topics.items()},
        }
        return settings, env

    def _sidecar(self, env: dict[str, str], name: str) -> SidecarProcess:
        p = SidecarProcess(env, self.workdir / f"{name}.log")
        self._live.append(p)
        return p

    @staticmethod
    def _score(result: ScenarioResult, expected: set[str], out: Outputs) -> None:
        seen: Counter[str] = Counter(v["request_id"] for v in out.verdicts)
        keys = {(v["request_id"], v["idempotency_key"]) for v in out.verdicts}
        result.verdicts = len(out.verdicts)
        result.duplicates = sum(seen.values()) - len(seen)
        keys_per_request = Counter(rid for rid, _ in keys)
        result.key_conflicts = sum(1 for n in keys_per_request.values() if n > 1)
        if result.key_conflicts:
            result.notes.append("some duplicate verdicts carry different idempotency keys")
        result.lost += len(expected - set(seen))
        result.dlq = sum(out.dlq_reasons.values())
        result.dlq_reasons = dict(out.dlq_reasons)

    # ------------------------------------------------------------------ scenarios

    async def restarts(self, sig: signal.Signals, kills: int = 3) -> ScenarioResult:
        """Traffic flows while the sidecar is stopped with ``sig`` at random moments."""
        name = "sigkill-restart" if sig == signal.SIGKILL else "sigterm-restart"
        result = ScenarioResult(name)
        started = time.monotonic()
        settings, env = self._settings()
        await create_topics(settings)
        n = 150 if self.quick else 3000
        ids = [f"{name}-{i}" for i in range(n)]
        records = [r for rid in ids for r in request_records(settings.topics, rid)]
        current = [self._sidecar(env, f"{name}-0")]
        current[0].start()
        watch = Watch(settings, lambda: current)

        async def killer() -> None:
            span = n / 50.0  # the traffic below lasts about this long
            for i in range(kills):
                await asyncio.sleep(self.rng.uniform(0.2, span / kills))
                await asyncio.to_thread(current[0].signal, sig)
                nxt = self._sidecar(env, f"{name}-{i + 1}")
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
        self._score(result, expected, tail.out)
        result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
        result.seconds = round(time.monotonic() - started, 1)
        return result

    async def broker_restart(self) -> ScenarioResult:
        """The broker stops mid-stream and comes back on the same data directory."""
        result = ScenarioResult("broker-restart")
        started = time.monotonic()
        settings, env = self._settings()
        await create_topics(settings)
        n = 100 if self.quick else 2000
        ids = [f"br-{i}" for i in range(n)]
        half = n // 2
        side = self._sidecar(env, "broker-restart")
        side.start()
        first = [r for rid in ids[:half] for r in request_records(settings.topics, rid)]
        second = [r for rid in ids[half:] for r in request_records(settings.topics, rid)]
        result.sent = await send(settings, first, rate_per_s=200.0)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(self.broker.stop)
        not_ready = False
        for _ in range(40):  # up to 10 s of outage while watching readiness
            await asyncio.sleep(0.25)
            not_ready = not_ready or not side.ready()
        await asyncio.to_thread(self.broker.start)
        result.notes.append(f"readiness went false during the outage: {not_ready}")
        result.not_ready_during_outage = not_ready
        result.sent += await send(settings, second, rate_per_s=200.0)
        watch = Watch(settings, lambda: [side])
        expected = set(ids)
        await watch.run(lambda o: expected <= {v["request_id"] for v in o.verdicts}, 90)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(side.signal, signal.SIGTERM)
        result.requests = n
        self._score(result, expected, watch.out)
        result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
        result.seconds = round(time.monotonic() - started, 1)
        return result

    async def network_stall(self, stall_s: float = STALL_S) -> ScenarioResult:
        """The sidecar's network turns slow (latency, a bandwidth cap), stalls, then recovers.

        Only the sidecar crosses the proxy (it bootstraps on the broker's PROXIED
        listener); the load generator and the watcher go straight to the broker,
        so input keeps arriving during the stall and the lag builds up. Readiness
        is polled throughout; ``recovery_s`` is from the resume to the last verdict.
        """
        result = ScenarioResult("network-stall")
        started = time.monotonic()
        settings, env = self._settings()
        proxied = self.broker.proxied_bootstrap_servers
        assert proxied is not None  # noqa: S101 - Chaos builds its broker with the listener
        env |= {
            "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": proxied,
            "GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS": str(STALL_REQUEST_TIMEOUT_MS),
            "GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS": str(STALL_SESSION_TIMEOUT_MS),
            "GUARDRAIL_JOIN__TTL_MS": str(STALL_JOIN_TTL_MS),
        }
        await create_topics(settings)
        line = _StallTimeline(slow_s=10.0 if self.quick else 60.0, stall_s=stall_s)
        n = int(STALL_RATE_PER_S * (line.slow_s + stall_s))
        ids = [f"stall-{i}" for i in range(n)]
        records = [r for rid in ids for r in request_records(settings.topics, rid)]
        expected = set(ids)
        side = self._sidecar(env, "network-stall")
        proxy = self.proxy
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
        self._score(result, expected, tail.out)
        result.not_ready_during_outage = line.went_down is not None
        result.ready_after_outage = line.came_back is not None
        result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
        result.notes += line.notes(side.tail(100_000_000))
        result.seconds = round(time.monotonic() - started, 1)
        return result

    async def bad_input(self) -> ScenarioResult:
        """Every hostile message goes to the DLQ or yields a verdict; serving goes on."""
        result = ScenarioResult("bad-input")
        started = time.monotonic()
        settings, env = self._settings()
        await create_topics(settings)
        side = self._sidecar(env, "bad-input")
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
        self._score(result, expected, watch.out)
        result.lost += max(0, want_dlq - result.dlq)
        result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
        result.seconds = round(time.monotonic() - started, 1)
        return result

    async def soak(
        self, minutes: float, rate: float, half_fraction: float, max_entries: int
    ) -> ScenarioResult:
        """Sustained load with half-requests that never complete: memory must stay flat.

        A ``half_fraction`` of requests never send their final event; they sit in the
        join store until the TTL evicts them (``block``/``incomplete`` verdicts). RSS
        is sampled every second; the first and last minute are compared.
        """
        result = ScenarioResult("soak")
        started = time.monotonic()
        settings, env = self._settings()
        env["GUARDRAIL_JOIN__MAX_ENTRIES"] = str(max_entries)
        env["GUARDRAIL_JOIN__TTL_MS"] = "5000"
        await create_topics(settings)
        side = self._sidecar(env, "soak")
        side.start()
        n = int(rate * minutes * 60)
        ids = [f"soak-{i}" for i in range(n)]
        rss: list[tuple[float, float]] = []

        def records() -> Iterable[Record]:
            for rid in ids:
                recs = request_records(settings.topics, rid)
                if self.rng.random() < half_fraction:
                    recs = recs[:-1]  # the final never comes
                yield from recs

        async def sample() -> None:
            while True:
                value = side.rss_mb()
                if value is not None:
                    rss.append((time.monotonic() - started, value))
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample())
        watch = Watch(settings, lambda: [side])
        expected = set(ids)
        watcher = asyncio.create_task(
            watch.run(
                lambda o: expected <= {v["request_id"] for v in o.verdicts}, minutes * 60 + 120
            )
        )
        result.sent = await send(settings, records(), rate_per_s=rate * 3.5)
        await watcher
        sampler.cancel()
        await asyncio.to_thread(side.signal, signal.SIGTERM)
        result.requests = n
        self._score(result, expected, watch.out)
        result.peak_rss_mb, result.max_lag = watch.peak_rss_mb, watch.max_lag
        first = [v for t, v in rss if t <= 60] or [0.0]
        last = [v for t, v in rss if t >= rss[-1][0] - 60] if rss else [0.0]
        incomplete = sum(
            1 for v in watch.out.verdicts if any(r["code"] == "incomplete" for r in v["reasons"])
        )
        result.notes += [
            f"rss first minute max {max(first):.1f} MB, last minute max {max(last):.1f} MB",
            f"incomplete verdicts (evicted half-requests): {incomplete}",
        ]
        result.seconds = round(time.monotonic() - started, 1)
        return result


def run_soak(
    minutes: float, rate: float, half_fraction: float, max_entries: int, seed: int = 7
) -> dict[str, Any]:
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="soak-", dir=home) as tmp,
        Chaos(Path(tmp), seed, quick=False) as chaos,
    ):
        result = asyncio.run(chaos.soak(minutes, rate, half_fraction, max_entries))
    return {"scenarios": [asdict(result)]}


SCENARIOS = ("sigkill-restart", "sigterm-restart", "broker-restart", "bad-input", "network-stall")


def run_chaos(
    quick: bool = True, seed: int = 7, only: Iterable[str] | None = None
) -> dict[str, Any]:
    """The suite (``SCENARIOS``, in that order), or the named subset of it."""
    chosen = set(SCENARIOS if only is None else only)
    unknown = chosen - set(SCENARIOS)
    if unknown:
        raise ConfigError(
            f"unknown chaos scenario(s) {sorted(unknown)}; known: {', '.join(SCENARIOS)}"
        )
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="chaos-", dir=home) as tmp,
        Chaos(Path(tmp), seed, quick) as chaos,
    ):
        scenarios: dict[str, Callable[[], Awaitable[ScenarioResult]]] = {
            "sigkill-restart": lambda: chaos.restarts(signal.SIGKILL),
            "sigterm-restart": lambda: chaos.restarts(signal.SIGTERM),
            "broker-restart": chaos.broker_restart,
            "bad-input": chaos.bad_input,
            "network-stall": chaos.network_stall,
        }

        async def all_scenarios() -> list[ScenarioResult]:
            return [await scenarios[name]() for name in SCENARIOS if name in chosen]

        results = asyncio.run(all_scenarios())
    return {"quick": quick, "seed": seed, "scenarios": [asdict(r) for r in results]}
