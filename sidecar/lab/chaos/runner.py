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
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from sidecar.config import JoinSettings, LimitSettings, Settings
from sidecar.exceptions import ConfigError
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import hostile_corpus, request_records
from sidecar.lab.chaos.hostile import (
    CHAOS_ID_HEADER,
    TENANT,
    AttentionShape,
    HostileFactory,
    HostileRecord,
    Outcome,
    tagged,
    tally,
)
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.chaos.progress import (
    WEDGE_SLACK_S,
    PendingSampler,
    longest_quiet,
    wedge_threshold_s,
)
from sidecar.lab.chaos.proxy import ProxyStats, ThrottlingProxy
from sidecar.lab.localkafka.broker import LocalKafka, default_home, ensure_jars, free_port
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

# hostile: limits small enough that records at every limit are cheap to build and send;
# the tenant comes from a trusted header, so another tenant's ids and a missing or
# undecodable header are part of the corpus.
HOSTILE_LIMITS = LimitSettings(
    max_message_bytes=32_768, max_hits=16, max_answer_chars=8_000, max_request_bytes=36_864
)
HOSTILE_JOIN_MAX_BYTES = 262_144  # the join flood (half-requests of ~31 KB) crosses it
TENANT_HEADER = "x-tenant"
HOSTILE_RATE_PER_S = 200.0  # records per second


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
    # longest interval with input pending and nothing published, when over the wedge
    # threshold (progress.wedge_threshold_s), else 0; None where not measured
    wedged_s: float | None = None
    unexpected: int = 0  # tracked records whose outcome is not the one required (hostile)
    memory: dict[str, Any] = field(default_factory=dict)  # the soak's RSS budget check
    notes: list[str] = field(default_factory=list)


@dataclass
class Outputs:
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    dlq_reasons: Counter[str] = field(default_factory=Counter)
    dlq_ids: dict[str, str] = field(default_factory=dict)  # x-chaos-id -> DLQ reason
    last_verdict_at: float = 0.0  # time.monotonic() when the latest verdict was read
    progress: list[float] = field(default_factory=list)  # when each verdict or DLQ was read


class Watch:
    """Reads the verdict and DLQ topics and samples RSS and lag in the background."""

    def __init__(
        self,
        settings: Settings,
        sidecars: Callable[[], Iterable[SidecarProcess]],
        *,
        sample_lag: bool = True,  # off where a PendingSampler measures it
    ) -> None:
        self.settings = settings
        self.sidecars = sidecars
        self.sample_lag = sample_lag
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
                        now = time.monotonic()
                        if m.topic == t.dlq:
                            headers = dict(m.headers)
                            reason = headers.get("x-dlq-reason", b"?").decode()
                            self.out.dlq_reasons[reason] += 1
                            chaos_id = headers.get(CHAOS_ID_HEADER)
                            if chaos_id is not None:
                                self.out.dlq_ids[chaos_id.decode()] = reason
                        else:
                            self.out.verdicts.append(orjson.loads(m.value))
                            self.out.last_verdict_at = now
                        self.out.progress.append(now)
                if self.sample_lag and time.monotonic() >= next_lag:
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


def _hostile_env(limits: LimitSettings) -> dict[str, str]:
    env = {f"GUARDRAIL_LIMITS__{k.upper()}": str(v) for k, v in limits.model_dump().items()}
    return env | {"GUARDRAIL_TENANCY__SOURCE": "header", "GUARDRAIL_TENANCY__HEADER": TENANT_HEADER}


def _join_of(env: dict[str, str]) -> JoinSettings:
    """The join settings a sidecar started with ``env`` runs with (for the wedge threshold)."""
    return JoinSettings(
        ttl_ms=int(env["GUARDRAIL_JOIN__TTL_MS"]),
        sweep_interval_ms=int(env["GUARDRAIL_JOIN__SWEEP_INTERVAL_MS"]),
    )


def _attention_shape(settings: Settings) -> AttentionShape | None:
    """The served lookback model's summary shape (its metadata.json), if it is on."""
    if not settings.signals.lookback:
        return None
    meta = Path(settings.models.dir) / settings.signals.lookback_model / "metadata.json"
    try:
        m = orjson.loads(meta.read_bytes())
    except OSError:
        return None
    return AttentionShape(m["generator_model"], m["layers"], m["heads"], m["chunks"])


class _Tracked:
    """Every sent record under a chaos id, with what must come of it."""

    def __init__(self, factory: HostileFactory, keep_values: bool = True) -> None:
        self.factory = factory
        self.keep_values = keep_values
        self.hostile: dict[str, HostileRecord] = {}
        self.ordinary_records: dict[str, HostileRecord] = {}
        self.ordinary_ids: list[str] = []
        self._next = 0

    def _tag(self, h: HostileRecord, into: dict[str, HostileRecord]) -> Record:
        cid = str(self._next)
        self._next += 1
        out = tagged(h.record, int(cid))
        kept = h if self.keep_values else replace(h, record=replace(h.record, value=b""))
        into[cid] = kept
        return out

    def add(self, group: Iterable[HostileRecord]) -> list[Record]:
        return [self._tag(h, self.hostile) for h in group]

    def ordinary(self, rid: str, drop_final: bool = False) -> list[Record]:
        """A whole request of the trusted tenant (``drop_final``: it never completes)."""
        self.ordinary_ids.append(rid)
        records = self.factory.ordinary(rid)
        if drop_final:
            records = records[:-1]
        return [
            self._tag(
                HostileRecord(
                    "ordinary", r, Outcome.ANSWER, (TENANT, rid), complete=not drop_final
                ),
                self.ordinary_records,
            )
            for r in records
        ]

    def satisfied(self, out: Outputs) -> bool:
        """Every required verdict and dead letter has been read."""
        answered = _final_verdicts(out)
        if any(answered[(TENANT, rid)] == 0 for rid in self.ordinary_ids):
            return False
        for cid, h in self.hostile.items():
            if h.outcome is Outcome.DLQ and cid not in out.dlq_ids:
                return False
            if h.outcome is Outcome.ANSWER and h.request and answered[h.request] == 0:
                return False
        return True

    def score(
        self, result: ScenarioResult, out: Outputs, *, committed_all: bool, exactly_one: bool
    ) -> None:
        """``lost``: ordinary requests without (exactly) one verdict, plus hostile records
        neither dead-lettered nor answered; ``unexpected``: any other outcome than required."""
        answered = _final_verdicts(out)
        incomplete = {
            (v.get("tenant") or "", v["request_id"])
            for v in out.verdicts
            if any(r["code"] == "incomplete" for r in v["reasons"])
        }
        ordinary_lost = sum(
            1
            for rid in self.ordinary_ids
            if (answered[(TENANT, rid)] != 1 if exactly_one else answered[(TENANT, rid)] == 0)
        )
        hostile = tally(
            self.hostile, out.dlq_ids, answered, committed_all=committed_all, incomplete=incomplete
        )
        leaks = tally(
            self.ordinary_records,
            out.dlq_ids,
            answered,
            committed_all=committed_all,
            incomplete=incomplete,
        )
        result.lost += ordinary_lost + hostile.lost
        unexpected = hostile.unexpected + leaks.unexpected
        result.unexpected = len(unexpected)
        result.duplicates = sum(n - 1 for n in answered.values() if n > 1)
        result.verdicts = len(out.verdicts)
        result.dlq = sum(out.dlq_reasons.values())
        result.dlq_reasons = dict(out.dlq_reasons)
        why = Counter(
            "capacity" if "(capacity)" in r["message"] else "ttl"
            for v in out.verdicts
            for r in v["reasons"]
            if r["code"] == "incomplete"
        )
        result.notes += [
            f"incomplete verdicts by eviction: {dict(why)} (capacity: count or byte budget)",
            f"ordinary requests: {len(self.ordinary_ids)}, without "
            f"{'exactly one' if exactly_one else 'a'} verdict: {ordinary_lost}",
            f"hostile records: {len(self.hostile)} in {len(hostile.by_case)} cases, "
            f"neither dead-lettered nor answered: {hostile.lost}",
            f"input committed to the end of every partition: {committed_all}",
            *(f"unexpected: {u}" for u in unexpected[:20]),
        ]


def _final_verdicts(out: Outputs) -> Counter[tuple[str, str]]:
    """Final verdicts per (tenant, request id)."""
    return Counter(
        (v.get("tenant") or "", v["request_id"])
        for v in out.verdicts
        if v.get("stage", "final") == "final"
    )


async def _settle(
    tracked: _Tracked,
    out: Outputs,
    sampler: PendingSampler,
    *,
    since: float,
    timeout_s: float,
    quiet_s: float = 1.5,
) -> bool:
    """Wait until all input since ``since`` is committed and every required output was read
    (or, should an expectation be wrong, nothing more came for ``quiet_s``); False on timeout.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = sampler.samples[-1] if sampler.samples else None
        if last is not None and last[0] > since and last[1] == 0:
            latest = max(out.progress[-1] if out.progress else since, since)
            if tracked.satisfied(out) or time.monotonic() - latest >= quiet_s:
                return True
        await asyncio.sleep(0.2)
    return False


def _wedge(
    result: ScenarioResult, sampler: PendingSampler, out: Outputs, join: JoinSettings
) -> float:
    """``wedged_s``: the longest quiet interval with input pending, if over the threshold."""
    quiet = longest_quiet(sampler.samples, out.progress)
    threshold = wedge_threshold_s(join)
    result.notes.append(
        f"longest quiet interval with input pending: {quiet:.1f} s (a wedge above "
        f"{threshold:.1f} s: TTL + sweep + {WEDGE_SLACK_S:.0f} s); lag samples: "
        f"{len(sampler.samples)}, missed: {sampler.missed}"
    )
    return round(quiet, 1) if quiet > threshold else 0.0


def _log_errors(side: SidecarProcess) -> str:
    lines = side.tail(100_000_000).splitlines()
    errors = [line for line in lines if " ERROR " in line]
    tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
    last = f"; the last: {errors[-1][:300]}" if errors else ""
    return f"sidecar log: {len(errors)} ERROR lines, {tracebacks} tracebacks{last}"


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

    async def _hostile_sidecar(
        self, name: str, join_env: dict[str, str]
    ) -> tuple[Settings, JoinSettings, SidecarProcess, HostileFactory]:
        """Fresh topics and a ready sidecar with the hostile limits and header tenancy."""
        settings, env = self._settings()
        env |= _hostile_env(HOSTILE_LIMITS) | join_env
        await create_topics(settings)
        side = self._sidecar(env, name)
        await asyncio.to_thread(side.start)
        factory = HostileFactory(
            settings.topics,
            HOSTILE_LIMITS,
            tenant_header=TENANT_HEADER,
            attention=_attention_shape(settings),
            seed=self.rng.randrange(2**31),
        )
        return settings, _join_of(env), side, factory

    async def hostile(self) -> ScenarioResult:
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
        settings, join, side, factory = await self._hostile_sidecar(
            "hostile", {"GUARDRAIL_JOIN__MAX_BYTES": str(HOSTILE_JOIN_MAX_BYTES)}
        )
        tracked = _Tracked(factory)
        phases = self._hostile_phases(factory, tracked)
        timeout = 60.0 if self.quick else 180.0
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
                    await _settle(tracked, watch.out, sampler, since=since, timeout_s=timeout)
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
        result.wedged_s = _wedge(result, sampler, watch.out, join)
        result.notes += [
            f"sidecar alive and ready at the end: {alive}; phases settled: {settled}",
            _log_errors(side),
        ]
        result.peak_rss_mb = watch.peak_rss_mb
        result.max_lag = max((lag for _, lag in sampler.samples), default=0)
        result.seconds = round(time.monotonic() - started, 1)
        return result

    def _hostile_phases(
        self, factory: HostileFactory, tracked: _Tracked
    ) -> list[Callable[[], list[Record]]]:
        """The hostile scenario's three phases, each built when it is sent."""
        n, labels, resends, flood = (40, 200, 10, 16) if self.quick else (400, 5000, 100, 64)
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
            return out + tracked.add(
                factory.late_resends("late-resend-hostile", answered[:resends])
            )

        def third() -> list[Record]:
            return tracked.add(factory.join_flood("h3-", flood))

        return [first, second, third]

    async def soak(self, plan: SoakPlan) -> ScenarioResult:
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
        settings, join, side, factory = await self._hostile_sidecar(
            "soak",
            {
                "GUARDRAIL_JOIN__MAX_BYTES": str(plan.join_max_bytes),
                "GUARDRAIL_JOIN__MAX_ENTRIES": str(plan.max_entries),
                "GUARDRAIL_JOIN__TTL_MS": "5000",
            },
        )
        await asyncio.sleep(2.0)
        baseline = side.rss_mb() or 0.0
        tracked = _Tracked(factory, keep_values=False)
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
            records = self._soak_records(plan, factory, tracked, n)
            result.sent = await send(settings, records, rate_per_s=plan.rate * 3.5)
            await _settle(tracked, watch.out, sampler, since=time.monotonic(), timeout_s=120.0)
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
        result.wedged_s = _wedge(result, sampler, watch.out, join)
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
            _log_errors(side),
        ]
        result.seconds = round(time.monotonic() - started, 1)
        return result

    def _soak_records(
        self, plan: SoakPlan, factory: HostileFactory, tracked: _Tracked, n: int
    ) -> Iterator[Record]:
        """The soak's traffic, built as it is sent (nothing large is kept)."""
        recent: deque[str] = deque(maxlen=8)
        decided_after = int(plan.rate * 20)  # a request this many slots back is decided
        hostile = plan.oversize_fraction + plan.poison_fraction
        for i in range(n):
            draw = self.rng.random()
            if draw < plan.oversize_fraction:
                yield from tracked.add(factory.oversize(f"s{i}-"))
            elif (
                draw < hostile
                and len(tracked.ordinary_ids) >= decided_after
                and self.rng.random() < 0.2
            ):
                old = tracked.ordinary_ids[-decided_after]  # a late re-send
                yield from tracked.add(factory.late_resends("late-resend", factory.ordinary(old)))
            elif draw < hostile:
                victims = list(recent)  # each victim id is used by one poison case only
                recent.clear()
                yield from tracked.add(factory.poison(f"s{i}-", victims))
            else:
                rid = f"soak-{i}"
                yield from tracked.ordinary(rid, drop_final=self.rng.random() < plan.half_fraction)
                recent.append(rid)


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


def run_soak(plan: SoakPlan, seed: int = 7) -> dict[str, Any]:
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="soak-", dir=home) as tmp,
        Chaos(Path(tmp), seed, quick=False) as chaos,
    ):
        result = asyncio.run(chaos.soak(plan))
    return {"plan": asdict(plan), "scenarios": [asdict(result)]}


SCENARIOS = (
    "sigkill-restart",
    "sigterm-restart",
    "broker-restart",
    "bad-input",
    "hostile",
    "network-stall",
)


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
            "hostile": chaos.hostile,
            "network-stall": chaos.network_stall,
        }

        async def all_scenarios() -> list[ScenarioResult]:
            return [await scenarios[name]() for name in SCENARIOS if name in chosen]

        results = asyncio.run(all_scenarios())
    return {"quick": quick, "seed": seed, "scenarios": [asdict(r) for r in results]}
