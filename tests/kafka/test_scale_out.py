"""Several sidecars in one consumer group: the join stays together (real broker only).

Requests flow through N ``guardrail run`` processes sharing a group over P
partitions (P odd or larger than N: where aiokafka's default round-robin
assignor tears ``retrieval[p]`` and ``generation[p]`` apart). One instance is
killed (SIGKILL) or stopped (SIGTERM) mid-load; every request must still get a
verdict, none ``incomplete`` (both halves are in Kafka), repeats only with the
same idempotency key, and the sidecar never writes into its input topics while
every producer partitions with murmur2 (with another partitioner, the records off
their request's partition are rerouted there: tested here too).

The control runs two in-process services with aiokafka's round-robin assignor:
the split must show (each half evicted on its own member), so the test that
says the assignor fixes it can fail.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from confluent_kafka import Producer

from guardrail_client.keys import partition_for
from sidecar.config import Settings
from sidecar.kafka.app import SidecarService
from sidecar.kafka.assignor import co_partition_assignor
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.corpus import request_records
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.chaos.proxy import ThrottlingProxy
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.lab.replay import Record, send
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.kafka.harness import committed, end_offsets, wait_until

pytestmark = pytest.mark.connected

TTL_MS = 3_000  # a torn request is evicted (``incomplete``) after this
SESSION_TIMEOUT_MS = 6_000  # the broker's group.min.session.timeout.ms: a killed member's end


def _settings(
    bootstrap: str, topics: dict[str, str], partitions: int, *, reroute: bool = True
) -> Settings:
    return Settings.load(
        kafka={"bootstrap_servers": bootstrap, "group_id": topics["group"]},
        topics={**{k: v for k, v in topics.items() if k != "group"}, "partitions": partitions},
        join={"ttl_ms": TTL_MS, "sweep_interval_ms": 200, "reroute": reroute},
        http={"enabled": False},
    )


def _env(settings: Settings) -> dict[str, str]:
    t = settings.topics
    return {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "GUARDRAIL_KAFKA__GROUP_ID": settings.kafka.group_id,
        "GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "GUARDRAIL_JOIN__TTL_MS": str(TTL_MS),
        "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "200",
        **{
            f"GUARDRAIL_TOPICS__{name.upper()}": getattr(t, name)
            for name in ("retrieval", "generation", "claims", "verdicts", "dlq")
        },
        "GUARDRAIL_TOPICS__FEEDBACK": t.feedback,
        "GUARDRAIL_TOPICS__REPORTS": t.reports,
        "GUARDRAIL_TOPICS__CERTIFICATES": t.certificates,
    }


def interleaved(
    settings: Settings,
    ids: list[str],
    seed: int = 14,
    spread: tuple[float, float] = (1.0, 12.0),
    deltas: int = 2,
) -> list[Record]:
    """Whole requests, several open at once and of different lengths, as a busy LLM service
    writes them: request i's retrieval at step i, its ``deltas`` deltas and final spread over
    the next 1 to 12 steps (``spread``): a long answer started early finishes after short
    ones started later."""
    rng = random.Random(seed)
    timed: list[tuple[float, int, Record]] = []
    for i, rid in enumerate(ids):
        records = request_records(settings.topics, rid, deltas=deltas)
        length = rng.uniform(*spread)
        steps = len(records) - 1
        for j, record in enumerate(records):
            timed.append((i + length * j / steps, len(timed), record))
    return [record for _, _, record in sorted(timed, key=lambda x: (x[0], x[1]))]


@dataclass
class Seen:
    """What came out on the verdict topic, per request."""

    keys: dict[str, set[str]] = field(default_factory=dict)
    count: Counter[str] = field(default_factory=Counter)
    incomplete: set[str] = field(default_factory=set)
    messages: dict[str, list[str]] = field(default_factory=dict)  # incomplete verdicts' texts
    first_at: dict[str, float] = field(default_factory=dict)
    last_at: float = 0.0

    def add(self, verdict: dict[str, Any], now: float) -> None:
        rid = verdict["request_id"]
        self.keys.setdefault(rid, set()).add(verdict["idempotency_key"])
        self.count[rid] += 1
        self.first_at.setdefault(rid, now)
        self.last_at = now
        if any(r["code"] == "incomplete" for r in verdict["reasons"]):
            self.incomplete.add(rid)
            self.messages.setdefault(rid, []).extend(r["message"] for r in verdict["reasons"])

    @property
    def duplicates(self) -> int:
        return sum(self.count.values()) - len(self.count)


class VerdictSink(Protocol):
    def add(self, verdict: dict[str, Any], now: float) -> None: ...


async def watch(
    settings: Settings, seen: VerdictSink, stop: asyncio.Event, *, claims: bool = False
) -> None:
    """Every verdict on the topic into ``seen`` (its parsed JSON, when it came) until ``stop``;
    ``claims``: the claim verdicts' topic's too (told apart by ``event_type``)."""
    consumer = AIOKafkaConsumer(
        settings.topics.verdicts,
        *((settings.topics.claims,) if claims else ()),
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.monotonic()
            for records in batch.values():
                for r in records:
                    seen.add(orjson.loads(r.value), now)
    finally:
        await consumer.stop()


@pytest.fixture
def fleet() -> Iterator[list[SidecarProcess]]:
    live: list[SidecarProcess] = []
    yield live
    for p in live:
        if p.pid is not None:
            p.signal(signal.SIGKILL)


async def test_a_rolling_update_with_as_many_replicas_as_partitions_completes(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
) -> None:
    """maxSurge 1 / maxUnavailable 0 at replicas == partitions: the surge pod joins a group
    whose partitions are all held (the sticky assignor keeps them where they are). It must
    be ready anyway, or the old pods are never removed and the rollout never ends."""
    partitions = 2
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    env = _env(settings)
    old = [SidecarProcess(env, tmp_path / f"old-{i}.log") for i in range(partitions)]
    fleet += old
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in old))
    await wait_until(lambda: all(p.ready() for p in old), 30, "the old replicas ready")
    surge = SidecarProcess(env, tmp_path / "surge.log")
    fleet.append(surge)
    await asyncio.to_thread(surge.start)
    await wait_until(surge.ready, 30, "the surge replica ready (it may hold no partition)")
    # the rollout goes on: an old replica leaves, the surge one takes over its partitions
    assert await asyncio.to_thread(old[0].signal, signal.SIGTERM) == 0, old[0].tail()
    ids = [f"ru-{i}" for i in range(40)]
    seen = Seen()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    try:
        assert await send(settings, interleaved(settings, ids)) > 0
        await wait_until(lambda: set(seen.count) >= set(ids), 45, "a verdict for every request")
    finally:
        stop.set()
        await watcher
    assert surge.ready() and old[1].ready()
    assert not seen.incomplete  # both halves are in Kafka: every request decided on its merits


@pytest.mark.parametrize(
    ("instances", "partitions", "sig"),
    [
        (2, 3, signal.SIGKILL),
        (2, 3, signal.SIGTERM),
        (3, 5, signal.SIGKILL),
        (3, 5, signal.SIGTERM),
    ],
    ids=["2x3-sigkill", "2x3-sigterm", "3x5-sigkill", "3x5-sigterm"],
)
async def test_an_instance_lost_mid_load_loses_no_request_and_tears_none(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
    instances: int,
    partitions: int,
    sig: signal.Signals,
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    env = _env(settings)
    fleet += [SidecarProcess(env, tmp_path / f"sidecar-{i}.log") for i in range(instances)]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in fleet))
    # every /readyz is 200 once the last member joined: each holds whole partition numbers
    await wait_until(lambda: all(p.ready() for p in fleet), 30, "every instance ready")

    n = 300
    ids = [f"so-{i}" for i in range(n)]
    records = interleaved(settings, ids)
    rate = len(records) / 6.0  # six seconds of traffic
    seen = Seen()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    sending_at = time.monotonic()
    sender = asyncio.create_task(send(settings, records, rate_per_s=rate))
    await asyncio.sleep(2.5)
    fault_at = time.monotonic()
    code = await asyncio.to_thread(fleet[0].signal, sig)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL), fleet[0].tail()
    assert await sender == len(records)
    sent = await end_offsets(
        settings.kafka.bootstrap_servers, [t.retrieval, t.generation], partitions
    )
    assert sum(sent.values()) == len(records)

    await wait_until(lambda: set(seen.count) >= set(ids), 45, "a verdict for every request")
    # send() paces record k at sending_at + k / rate: a request is whole once its last is out
    whole_at = {r.key.decode(): sending_at + k / rate for k, r in enumerate(records) if r.key}
    latency = sorted(seen.first_at[rid] - whole_at[rid] for rid in ids)
    await asyncio.sleep(2.0)  # late repeats, if any
    stop.set()
    await watcher

    survivors = fleet[1:]
    assert all(p.ready() for p in survivors), [p.tail() for p in survivors]
    ends = await end_offsets(
        settings.kafka.bootstrap_servers, [t.retrieval, t.generation], partitions
    )
    assert ends == sent  # no sidecar wrote into an input topic
    assert set(seen.count) == set(ids)  # every request decided
    assert not seen.incomplete  # both halves were in Kafka: none torn apart
    assert all(len(keys) == 1 for keys in seen.keys.values())  # repeats carry the same key
    print(  # the measurement the report quotes (pytest -s)
        f"\n{instances} instances x {partitions} partitions, {sig.name}: {n} requests, "
        f"{sum(seen.count.values())} verdicts, {seen.duplicates} duplicates "
        f"(same key), {len(seen.incomplete)} incomplete; verdict latency median "
        f"{latency[len(latency) // 2]:.2f} s, worst {latency[-1]:.1f} s (the recovery); last "
        f"verdict {seen.last_at - fault_at:.1f} s after the fault"
    )


# ---------------------------------------------------------------- the control, in process


def _service(settings: Settings, assignor: Any) -> SidecarService:
    return SidecarService(settings, Processor(settings, PlaceholderPolicy()), assignor=assignor)


@asynccontextmanager
async def _two_members(
    settings: Settings, assignor: Callable[[], Any], assigned: int
) -> AsyncIterator[list[SidecarService]]:
    """Two started members of one group (``assignor()`` each: a fresh co-partition class
    remembers one consumer's numbers), each holding partitions, ``assigned`` in all."""
    services = [_service(settings, assignor()) for _ in range(2)]
    for s in services:
        await s.start()
    try:
        await wait_until(
            lambda: (
                all(s.state.assigned for s in services)
                and sum(len(s.state.assigned) for s in services) == assigned
            ),
            30,
            "both members assigned",
        )
        yield services
    finally:
        for s in services:
            await s.stop()


@pytest.mark.parametrize("assignor", ["roundrobin", "copartition"])
async def test_round_robin_tears_requests_apart_and_the_co_partition_assignor_does_not(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], assignor: str
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions=3)
    await create_topics(settings)
    strategy = (lambda: RoundRobinPartitionAssignor) if assignor == "roundrobin" else None
    async with _two_members(settings, strategy or co_partition_assignor, 9) as services:
        n = 100
        ids = [f"rr-{i}" for i in range(n)]
        seen = Seen()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(settings, seen, stop))
        await send(settings, interleaved(settings, ids))
        await wait_until(lambda: set(seen.count) >= set(ids), 30, "a verdict for every request")
        await asyncio.sleep(1.0)
        stop.set()
        await watcher
        splits = [problem for s in services for problem in s.state.split]
        if assignor == "roundrobin":
            # each member holds halves whose partners went to the other: not ready, said so
            assert splits and not any(s.ready for s in services)
            assert len(seen.incomplete) == n  # every request torn: each half evicted alone
            assert seen.duplicates >= n  # two verdicts (one per half), both incomplete
        else:
            assert not splits and all(s.ready for s in services)
            assert not seen.incomplete and seen.duplicates == 0
        print(  # the measurement the report quotes (pytest -s)
            f"\n{assignor}, 2 members x 3 partitions: {n} requests, "
            f"{sum(seen.count.values())} verdicts, {len(seen.incomplete)} incomplete; "
            f"split: {splits}"
        )


def _produce_with_librdkafka_defaults(
    bootstrap: str, records: list[Record], rate_per_s: float | None = None
) -> dict[str, int]:
    """Produce as a librdkafka client does out of the box (``consistent_random``: CRC32 of
    the key), at ``rate_per_s`` if given; returns the partition each key went to (-1: not
    delivered)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    placed: dict[str, int] = {}

    def delivered(err: object, msg: Any) -> None:
        placed[msg.key().decode()] = -1 if err else msg.partition()

    start = time.monotonic()
    for k, record in enumerate(records):
        if rate_per_s is not None and (wait := start + k / rate_per_s - time.monotonic()) > 0:
            time.sleep(wait)
            producer.poll(0)
        producer.produce(record.topic, record.value, record.key, on_delivery=delivered)
    assert producer.flush(30) == 0
    return placed


async def _split_producers(
    settings: Settings, ids: list[str]
) -> tuple[Seen, dict[str, int], set[str], list[Record]]:
    """Requests whose retrievals come from aiokafka (murmur2) and whose generation events
    come from librdkafka at its defaults (CRC32), until each has a verdict and a TTL more:
    what was seen, where each request's generation went, the requests it moved off their
    murmur2 partition, and the generation records."""
    t, partitions = settings.topics, settings.topics.partitions
    records = [r for rid in ids for r in request_records(t, rid)]
    generation = [r for r in records if r.topic == t.generation]
    seen = Seen()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    await send(settings, [r for r in records if r.topic == t.retrieval])
    placed = await asyncio.to_thread(
        _produce_with_librdkafka_defaults, settings.kafka.bootstrap_servers, generation
    )
    assert placed.keys() == set(ids) and -1 not in placed.values()
    moved = {rid for rid, p in placed.items() if p != partition_for(rid, partitions)}
    assert 0 < len(moved) < len(ids)  # the two partitioners differ
    await wait_until(lambda: set(seen.count) >= set(ids), 30, "a verdict for every request")
    await asyncio.sleep(TTL_MS / 1000 + 1.0)  # the other half's verdict, when torn
    stop.set()
    await watcher
    return seen, placed, moved, generation


async def test_without_rerouting_another_partitioner_is_named_in_each_torn_requests_verdict(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """Retrieval events from aiokafka (murmur2, Kafka's default), generation events from a
    librdkafka producer left at its default partitioner (CRC32): a request whose two
    hashes differ has its halves on two partition numbers, which the co-partitioning
    assignor may give to two replicas. Neither can decide it on its merits; before, each
    decided it ``incomplete`` saying only which half was missing, and nothing counted or
    logged it (3 replicas x 3 partitions: 21 of 30 requests, 42 verdicts, every counter
    0). With ``join.reroute`` off, the replica holding an input off its murmur2 partition
    counts it and its verdict names the partitioner."""
    partitions = 3
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions, reroute=False)
    await create_topics(settings)
    async with _two_members(settings, co_partition_assignor, 3 * partitions) as services:
        ids = [f"rdk-{i}" for i in range(30)]
        seen, placed, moved, _ = await _split_producers(settings, ids)
        owner = {tp[1]: i for i, s in enumerate(services) for tp in s.state.assigned}
        torn = {rid for rid in moved if owner[partition_for(rid, partitions)] != owner[placed[rid]]}
        assert torn and seen.incomplete == torn  # two replicas: torn, as before
        # the replica holding a torn request's misrouted half counts it; the halves that
        # met on one replica are a partition mismatch there
        assert sum(s.processor.intake.misrouted for s in services) == len(torn)
        assert sum(s.processor.intake.partition_mismatches for s in services) == len(moved - torn)
        for rid, messages in seen.messages.items():
            if rid in torn:
                assert any("belongs on partition" in m for m in messages), messages
        print(  # the measurement the report quotes (pytest -s)
            f"\n{len(ids)} requests, {len(moved)} with generation off its murmur2 partition, "
            f"{len(torn)} torn between the 2 replicas: {sum(seen.count.values())} verdicts"
        )


@pytest.mark.parametrize("partitions", [3, 4])
async def test_records_off_their_partition_are_rerouted_and_every_request_decided_once(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], partitions: int
) -> None:
    """The same producers, with ``join.reroute`` (the default): the replica that reads a
    generation event off its request's murmur2 partition sends it there when another
    replica reads that partition (and joins it itself when it does), and the replica
    holding the retrieval joins it. Every request gets one verdict, on its merits."""
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    async with _two_members(settings, co_partition_assignor, 3 * partitions) as services:
        ids = [f"rdk-{i}" for i in range(40)]
        seen, placed, moved, generation = await _split_producers(settings, ids)
        owner = {tp[1]: i for i, s in enumerate(services) for tp in s.state.assigned}
        torn = {rid for rid in moved if owner[partition_for(rid, partitions)] != owner[placed[rid]]}
        assert torn  # without rerouting these got two incomplete verdicts each
        assert not seen.incomplete and seen.duplicates == 0
        per_request = len(generation) // len(ids)  # deltas and the final
        assert sum(s.processor.intake.rerouted for s in services) == per_request * len(torn)
        assert sum(s.processor.intake.misrouted for s in services) == 0
        # the halves a replica reads both partitions of meet there, as before
        assert sum(s.processor.intake.partition_mismatches for s in services) == len(moved - torn)
        ends = await end_offsets(settings.kafka.bootstrap_servers, [t.generation], partitions)
        assert sum(ends.values()) == len(generation) + per_request * len(torn)  # the copies
        print(  # the measurement the report quotes (pytest -s)
            f"\n2 replicas x {partitions} partitions: {len(ids)} requests, {len(moved)} with "
            f"generation off its murmur2 partition ({len(torn)} across replicas): "
            f"{sum(seen.count.values())} verdicts, {len(seen.incomplete)} incomplete"
        )


async def test_a_round_robin_producer_spreading_each_answer_is_rerouted_whole(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """segmentio/kafka-go's default: each generation event of a request on the next
    partition in turn. Every delta and final off its request's partition, on a partition the
    other replica reads, is rerouted; one on a partition the same replica reads is joined
    there. A delta that comes after its final is finished, not dead-lettered, while the
    request is open or when the delta is off its request's partition; one on its request's
    own partition that comes after the verdict (its final read first on another partition
    of the same replica: no order holds between partitions) is still dead-lettered
    ``after-final``, as before rerouting. The requests' feedback labels, sent the same way,
    are each taken by the replica that decided their request."""
    partitions = 3
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    async with _two_members(settings, co_partition_assignor, 3 * partitions) as services:
        ids = [f"rr-{i}" for i in range(40)]
        records = [r for rid in ids for r in request_records(t, rid, deltas=4)]
        generation = [r for r in records if r.topic == t.generation]
        seen = Seen()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(settings, seen, stop))
        await send(settings, [r for r in records if r.topic == t.retrieval])
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await producer.start()
        try:
            for k, r in enumerate(generation):
                await producer.send(r.topic, r.value, key=r.key, partition=k % partitions)
            await producer.flush()
            await wait_until(lambda: set(seen.count) >= set(ids), 30, "a verdict each")
            for k, rid in enumerate(ids):
                label = {"schema_version": 1, "event_type": "feedback", "request_id": rid,
                         "correct": True, "source": "user"}  # fmt: skip
                value = orjson.dumps(label)
                await producer.send(t.feedback, value, key=rid.encode(), partition=k % partitions)
            await producer.flush()
        finally:
            await producer.stop()
        await asyncio.sleep(TTL_MS / 1000 + 1.0)  # a second verdict, if any request were torn
        stop.set()
        await watcher
        await wait_until(
            lambda: sum(s.processor.counters.feedback for s in services) == len(ids),
            30,
            "every label taken",
        )
        owner = {tp[1]: i for i, s in enumerate(services) for tp in s.state.assigned}

        def away(k: int, rid: str) -> bool:  # read by the other replica than its request
            return owner[k % partitions] != owner[partition_for(rid, partitions)]

        deciders = Counter(owner[partition_for(rid, partitions)] for rid in ids)
        assert [s.processor.counters.feedback for s in services] == [deciders[0], deciders[1]]
        keys = [(r.key or b"").decode() for r in generation]
        off = sum(away(k, rid) for k, rid in enumerate(keys))
        assert not seen.incomplete and seen.duplicates == 0 and set(seen.count) == set(ids)
        labels_off = sum(away(k, rid) for k, rid in enumerate(ids))
        assert sum(s.processor.intake.rerouted for s in services) == off + labels_off
        # only deltas on their request's own partition can come after the verdict unforgiven
        home_deltas = sum(
            k % partitions == partition_for(rid, partitions)
            for k, (rid, r) in enumerate(zip(keys, generation, strict=True))
            if b'"generation.delta"' in r.value
        )
        dead = sum(s.processor.counters.dead_letters for s in services)
        reasons = {r for s in services for r in s.processor.counters.dead_letter_reasons}
        assert reasons <= {"after-final"} and dead <= home_deltas
        late = sum(s.processor.intake.rerouted_late for s in services)
        print(  # the measurement the report quotes (pytest -s)
            f"\nround-robin, 2 replicas x {partitions} partitions: {len(ids)} requests, "
            f"{off} of {len(generation)} generation records rerouted, {late} deltas finished "
            f"after their final; {sum(seen.count.values())} verdicts, {len(seen.incomplete)} "
            f"incomplete, {dead} deltas dead-lettered after-final (of {home_deltas} on their "
            f"request's partition); {labels_off} of {len(ids)} labels rerouted, each taken by "
            "its request's replica"
        )


async def test_rerouting_survives_an_instance_killed_and_replaced_mid_load(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
) -> None:
    """3 ``guardrail run`` processes over 4 partitions; retrieval from aiokafka, generation
    from librdkafka at its default partitioner, nine seconds of traffic; one replica is
    SIGKILLed after 2.5 s (its rerouted records not yet committed are read and sent on
    again by the next owner: the copies are duplicates where they land) and a new one
    started at once, as its Deployment would: two rebalances while traffic flows, the
    second with handovers that name rerouted originals.

    A request rerouted across replicas has its halves on two of them: while the killed
    one's partitions wait for its session to time out, the other half waits on a live
    replica whose join clock runs. Its TTL must outlast that (the defaults: 30 s against
    a 10 s session); with the TTL at half the session (3 s, 6 s) 20 of 148 such requests
    were decided ``incomplete`` here, so this test runs at twice the session."""
    partitions, n = 4, 200
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    ttl_ms = 2 * SESSION_TIMEOUT_MS
    env = {**_env(settings), "GUARDRAIL_JOIN__TTL_MS": str(ttl_ms)}
    fleet += [SidecarProcess(env, tmp_path / f"sidecar-{i}.log") for i in range(3)]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in fleet))
    await wait_until(lambda: all(p.ready() for p in fleet), 30, "every instance ready")
    ids = [f"rk-{i}" for i in range(n)]
    records = interleaved(settings, ids)
    retrieval = [r for r in records if r.topic == t.retrieval]
    generation = [r for r in records if r.topic == t.generation]
    seen = Seen()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    # 12 s of traffic: the replacement is ready only once the killed member's session ends
    # (6 s; at 9 s of traffic, 6.1 s of the 6.5 left after the kill, and a loaded CI
    # machine's start outlasted it)
    sender = asyncio.create_task(send(settings, retrieval, rate_per_s=len(retrieval) / 12.0))
    librdkafka = asyncio.create_task(
        asyncio.to_thread(
            _produce_with_librdkafka_defaults,
            settings.kafka.bootstrap_servers,
            generation,
            len(generation) / 12.0,
        )
    )
    await asyncio.sleep(2.5)
    code = await asyncio.to_thread(fleet[0].signal, signal.SIGKILL)
    assert code == -signal.SIGKILL, fleet[0].tail()
    replacement = SidecarProcess(env, tmp_path / "sidecar-new.log")
    fleet.append(replacement)
    await asyncio.to_thread(replacement.start)
    assert not sender.done()  # it joined while traffic flowed
    assert await sender == len(retrieval)
    placed = await librdkafka
    moved = {rid for rid, p in placed.items() if p != partition_for(rid, partitions)}
    assert 0 < len(moved) < n
    await wait_until(lambda: set(seen.count) >= set(ids), 60, "a verdict for every request")
    await asyncio.sleep(ttl_ms / 1000 + 2.0)  # a second verdict, if any request were torn
    stop.set()
    await watcher
    assert all(p.ready() for p in fleet[1:]), [p.tail() for p in fleet[1:]]
    assert set(seen.count) == set(ids)
    assert not seen.incomplete  # rerouted halves met theirs, across both rebalances
    assert all(len(keys) == 1 for keys in seen.keys.values())  # repeats carry the same key
    ends = await end_offsets(settings.kafka.bootstrap_servers, [t.generation], partitions)
    copies = sum(ends.values()) - len(generation)
    keys = [(r.key or b"").decode() for r in generation]
    off_home = sum(placed[rid] != partition_for(rid, partitions) for rid in keys)
    # those whose partition another replica read when they were read (again, if read again)
    assert 0 < copies < 2 * off_home
    print(  # the measurement the report quotes (pytest -s)
        f"\n3 instances x {partitions} partitions, SIGKILL + a new one, generation from "
        f"librdkafka: {n} "
        f"requests, {len(moved)} off their murmur2 partition, {off_home} records off it, "
        f"{copies} copies written; {sum(seen.count.values())} verdicts, {seen.duplicates} "
        f"duplicates (same key), {len(seen.incomplete)} incomplete"
    )


# ---------------------------------------------------------------- start-up refusals


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "run"],
        env={**os.environ, **env, "GUARDRAIL_HTTP__ENABLED": "false"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _error_lines(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.startswith("guardrail:")]


async def test_run_refuses_missing_topics_and_unequal_partition_counts(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions=3)
    t = settings.topics
    env = _env(settings)

    missing = await asyncio.to_thread(_run, env)
    assert missing.returncode == 2, missing.stderr
    (line,) = _error_lines(missing)
    assert "configuration error" in line and t.retrieval in line and t.reports in line
    assert "Traceback" not in missing.stderr

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        counts = {t.retrieval: 3, t.generation: 2, t.feedback: 3}
        names = (t.claims, t.verdicts, t.dlq, t.reports, t.certificates)
        await admin.create_topics(
            [NewTopic(name, counts.get(name, 1), 1) for name in (*counts, *names)]
        )
    finally:
        await admin.close()
    unequal = await asyncio.to_thread(_run, env)
    assert unequal.returncode == 2, unequal.stderr
    (line,) = _error_lines(unequal)
    assert "partition counts differ" in line
    for name, n in counts.items():  # each input topic's count is named
        assert f"{name} has {n}" in line
    assert "Traceback" not in unequal.stderr


def test_run_with_a_wrong_bootstrap_server_ends_in_one_line() -> None:
    env = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS": "3000",
    }
    started = time.monotonic()
    out = _run(env)
    assert out.returncode == 1, out.stderr
    (line,) = _error_lines(out)
    assert "cannot reach Kafka at 127.0.0.1:" in line
    assert "gave up after" in line and "within" not in line  # refused: not the timeout
    assert "Traceback" not in out.stderr
    assert time.monotonic() - started < 30  # bounded by the request timeout, plus the start


def _probe(port: int, path: str) -> int | None:
    """The HTTP status of ``path`` on the sidecar's health port (``None``: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


async def test_a_sidecar_told_to_wait_for_kafka_is_live_until_it_comes_then_ready(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """``GUARDRAIL_KAFKA__WAIT_AT_START`` (the chart's inject mode): Kafka away at start must
    not stop the pod's start (a native sidecar's startup probe gates the LLM container).
    The health endpoints answer at once (live, not ready), Kafka is tried again until it
    answers, then the sidecar serves; SIGTERM while it waits ends it at once."""
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions=2)
    await create_topics(settings)
    broker_port = int(kafka_broker.bootstrap_servers.rsplit(":", 1)[1])
    proxy = ThrottlingProxy(broker_port, port=free_port())  # bound, not yet accepting
    env = {
        **_env(settings),
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": proxy.address,
        "GUARDRAIL_KAFKA__WAIT_AT_START": "true",
        "GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS": "2000",
    }
    waiting = SidecarProcess(env, tmp_path / "waiting.log")
    later = SidecarProcess(env, tmp_path / "later.log")
    for proc in (waiting, later):
        with proc.log.open("ab") as out:
            proc.proc = subprocess.Popen(
                [sys.executable, *proc.argv], env=proc.env, stdout=out, stderr=subprocess.STDOUT
            )
    try:
        for proc in (waiting, later):
            await wait_until(lambda p=proc: _probe(p.port, "/livez") == 200, 30, "live")
            assert _probe(proc.port, "/readyz") == 503
        await asyncio.sleep(3.0)  # at least one more attempt fails
        assert waiting.pid is not None and later.pid is not None, later.tail()
        assert "trying again" in later.tail()
        started = time.monotonic()
        assert await asyncio.to_thread(waiting.signal, signal.SIGTERM) == 0, waiting.tail()
        assert time.monotonic() - started < 10
        proxy.start()  # Kafka comes
        await wait_until(later.ready, 60, "ready once Kafka answers")
    finally:
        for proc in (waiting, later):
            if proc.pid is not None:
                proc.signal(signal.SIGTERM)
        proxy.close()


async def test_static_membership_joins_and_decides_on_the_real_broker(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    base = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions=3)
    await create_topics(base)
    services = [
        _service(
            base.model_copy(
                update={"kafka": base.kafka.model_copy(update={"group_instance_id": f"pod-{i}"})}
            ),
            co_partition_assignor(),
        )
        for i in range(2)
    ]
    for s in services:
        await s.start()
    try:
        await wait_until(
            lambda: (
                sum(len(s.state.assigned) for s in services) == 9 and all(s.ready for s in services)
            ),
            30,
            "both static members assigned, co-partitioned",
        )
        ids = [f"st-{i}" for i in range(20)]
        seen = Seen()
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(base, seen, stop))
        await send(base, interleaved(base, ids))
        await wait_until(lambda: set(seen.count) >= set(ids), 30, "a verdict for every request")
        stop.set()
        await watcher
        assert not seen.incomplete and seen.duplicates == 0
    finally:
        for s in services:
            await s.stop()


async def test_commits_keep_up_with_steady_overlapping_traffic_and_a_restart_repeats_nothing(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
) -> None:
    """Audit: with requests that always overlap (a streaming service is never idle), the cut
    lowered until no request straddled it stayed at the last idle moment: the committed
    offset stood still while traffic flowed, the lag grew without end, and a restart decided
    every request since again. With the handover in the commit's metadata the commit follows
    the oldest open request, and the replica that takes over skips what was finished."""
    partitions = 2
    settings = _settings(kafka_broker.bootstrap_servers, unique_topics, partitions)
    await create_topics(settings)
    t = settings.topics
    env = _env(settings)
    fleet.append(SidecarProcess(env, tmp_path / "first.log"))
    await asyncio.to_thread(fleet[0].start)
    await wait_until(fleet[0].ready, 30, "the first replica ready")
    ids = [f"st-{i}" for i in range(400)]
    records = interleaved(settings, ids, spread=(10.0, 30.0))  # never a quiet moment
    rate = len(records) / 10.0
    seen = Seen()
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, stop))
    sender = asyncio.create_task(send(settings, records, rate_per_s=rate))
    try:
        await asyncio.sleep(3.0)
        written = sum(
            (
                await end_offsets(settings.kafka.bootstrap_servers, [t.generation], partitions)
            ).values()
        )
        await asyncio.sleep(2.0)  # four ticks of commits later
        offsets = await committed(settings.kafka.bootstrap_servers, settings.kafka.group_id)
        committed_records = sum(off for (topic, _), off in offsets.items() if topic == t.generation)
        assert written > 200 and committed_records >= written * 0.8, (written, committed_records)
        # a restart mid-traffic: the replica that takes over reads the first one's handover
        assert await asyncio.to_thread(fleet[0].signal, signal.SIGTERM) == 0, fleet[0].tail()
        fleet.append(SidecarProcess(env, tmp_path / "second.log"))
        await asyncio.to_thread(fleet[1].start)
        assert await sender == len(records)
        await wait_until(lambda: set(seen.count) >= set(ids), 45, "a verdict for every request")
        await asyncio.sleep(2.0)  # late repeats, if any
    finally:
        stop.set()
        await watcher
    assert not seen.incomplete, fleet[1].tail(20000) + "\n-----\n" + fleet[0].tail(8000)
    assert seen.duplicates == 0, f"{seen.duplicates} requests decided twice"
    assert "handover from their last owner" in fleet[1].tail()
