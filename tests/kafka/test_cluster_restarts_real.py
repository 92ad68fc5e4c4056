"""The sidecar on a three-node Kafka cluster while its nodes restart (real brokers only).

Production Kafka is a cluster: every topic replicated on three nodes, writes needing two
in-sync replicas, and a node restarted at a time for every upgrade, configuration change
or host patch (a rolling restart), or lost without warning. Each moves partition
leaderships, and the group coordinator when its node goes, under the sidecar's consumer,
its verdict producer, its commits and the LLM service's own producer. Every other test
runs one broker, whose restart is a full outage; these run a real three-node KRaft cluster
(``sidecar.lab.localkafka.cluster``) with two sidecar processes in one group over three
partitions, requests flowing the whole time, while

- each node in turn is stopped (SIGTERM: controlled shutdown) and started again, the next
  only once every partition is fully replicated again, as an operator's rolling restart
  does; or
- the node leading the input topics' partition 0 is killed (SIGKILL) and started again.

The requests come from the guardrail client, as an LLM service sends them, and each is
awaited with ``VerdictClient.verdict`` (up to 60 s): every wait must end with the sidecar's
verdict, not the fallback.

A sloppy producer beside the service sends a truncated JSON record every half second.

Every request must get a verdict, none ``incomplete`` (both halves are in Kafka), repeats
only with the same idempotency key, each broken record dead-lettered exactly once and
nothing else, nothing written into an input topic, both sidecars up and ready at the end,
and no traceback or ERROR line in their logs.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from bench.verdict_client import HITS
from guardrail_client import VerdictResult, calm_kafka_logs
from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.kafka_logs import DEMOTIONS
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.cluster import LocalKafkaCluster
from tests.client.test_client_kafka import ANSWER, QUERY, publisher, verdict_client
from tests.client.test_kafka_logs import Keep, service_handlers
from tests.conftest import kafka_lib
from tests.kafka.harness import end_offsets, read_settled, wait_until
from tests.kafka.test_scale_out import Seen, _env, fleet, watch

pytestmark = pytest.mark.connected

__all__ = ["fleet"]  # the fixture, shared with test_scale_out

PARTITIONS = 3
INSTANCES = 2
RATE = 20.0  # requests per second, the whole time the nodes restart
# the join's default: a killed leader's partitions are away until the controller fences it
# (broker.session.timeout.ms, 9 s by default) and elects another; at the 3 s TTL of the
# scale-out tests, requests with one half there came out incomplete (one run of four)
TTL_MS = 30_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    """Three combined KRaft nodes; fails (never skips) when they cannot start."""
    root = tmp_path_factory.mktemp("kafka-cluster")
    nodes = LocalKafkaCluster(root, kafka_lib(), size=3)
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)


def _settings(bootstrap: str, topics: dict[str, str]) -> Settings:
    return Settings.load(
        kafka={"bootstrap_servers": bootstrap, "group_id": topics["group"]},
        topics={
            **{k: v for k, v in topics.items() if k != "group"},
            "partitions": PARTITIONS,
            "replication_factor": 3,
        },
        join={"ttl_ms": TTL_MS, "sweep_interval_ms": 200},
        http={"enabled": False},
    )


async def _partitions(bootstrap: str, topics: list[str]) -> list[dict[str, Any]]:
    """Each partition of ``topics``: its leader, replicas and in-sync replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    ok = [t for t in described if not t["error_code"]]
    return [{"topic": t["topic"], **p} for t in ok for p in t["partitions"]]


async def _fully_replicated(bootstrap: str, topics: list[str], timeout_s: float = 90.0) -> None:
    """Until every partition of ``topics`` has all its replicas in sync (an operator waits
    for no under-replicated partitions before restarting the next node)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            parts = await _partitions(bootstrap, topics)
            if {p["topic"] for p in parts} == set(topics) and all(
                sorted(p["isr"]) == sorted(p["replicas"]) for p in parts
            ):
                return
        except (KafkaError, OSError, TimeoutError):  # the cluster answers again in a moment
            parts = []
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions still under-replicated after {timeout_s}s: {parts}")
        await asyncio.sleep(0.5)


async def _traffic(settings: Settings, ids: list[str], stop: asyncio.Event) -> list[VerdictResult]:
    """Requests at :data:`RATE` per second from an LLM service using the guardrail client
    (``GuardrailPublisher``, and ``VerdictClient`` awaiting each verdict as the service
    would, up to 60 s), until ``stop``; the ids sent are appended to ``ids``. Returns what
    each wait gave."""
    async with publisher(settings) as pub, verdict_client(settings) as verdicts:
        waits: list[asyncio.Task[VerdictResult]] = []
        started = time.monotonic()
        while not stop.is_set():
            rid = f"cr-{len(ids)}"
            verdicts.expect(rid)
            await pub.retrieval(rid, QUERY, HITS, tenant="acme", collection="wiki")
            await pub.final(rid, ANSWER)
            waits.append(asyncio.create_task(verdicts.verdict(rid, timeout=60.0)))
            ids.append(rid)
            if (wait := started + len(ids) / RATE - time.monotonic()) > 0:
                await asyncio.sleep(wait)
        await pub.flush()
        return await asyncio.gather(*waits)


async def _broken(settings: Settings, stop: asyncio.Event) -> list[str]:
    """A sloppy producer beside the service: a truncated JSON record to the retrieval topic
    every half second until ``stop`` (idempotent, acks=all); the keys it sent."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers, acks="all", enable_idempotence=True
    )
    await producer.start()
    keys: list[str] = []
    try:
        while not stop.is_set():
            key = f"bad-{len(keys)}"
            value = (
                b'{"schema_version": 1, "event_type": "retrieval", "request_id": "' + key.encode()
            )
            await producer.send(settings.topics.retrieval, value, key=key.encode())
            keys.append(key)
            await asyncio.sleep(0.5)
        await producer.flush()
    finally:
        await producer.stop()
    return keys


def _spread(waited: list[VerdictResult]) -> str:
    s = sorted(w.waited_s for w in waited)
    return f"median {s[len(s) // 2]:.2f} s, p99 {s[int(len(s) * 0.99)]:.2f} s, max {s[-1]:.2f} s"


@pytest.fixture
def service_logs() -> Iterator[tuple[Keep, Keep]]:
    """This process is the LLM service: its handlers, and the client's opt-in."""
    with service_handlers() as handlers:
        calm_kafka_logs()
        yield handlers


@pytest.mark.parametrize("fault", ["rolling-restart", "leader-killed"])
async def test_requests_flow_on_while_the_clusters_nodes_restart(
    cluster: LocalKafkaCluster,
    unique_topics: dict[str, str],
    tmp_path: Path,
    fleet: list[SidecarProcess],
    fault: str,
    service_logs: tuple[Keep, Keep],
) -> None:
    settings = _settings(cluster.bootstrap_servers, unique_topics)
    t = settings.topics
    bootstrap = settings.kafka.bootstrap_servers
    await create_topics(settings)
    everything = [t.retrieval, t.generation, t.verdicts, t.claims, t.dlq]
    await _fully_replicated(bootstrap, everything)
    env = _env(settings) | {"GUARDRAIL_JOIN__TTL_MS": str(TTL_MS)}
    del env["GUARDRAIL_KAFKA__SESSION_TIMEOUT_MS"]  # the default, 10 s, as deployed
    fleet += [SidecarProcess(env, tmp_path / f"sidecar-{i}.log") for i in range(INSTANCES)]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in fleet))
    await wait_until(lambda: all(p.ready() for p in fleet), 30, "every instance ready")

    ids: list[str] = []
    seen = Seen()
    done_sending, done_watching = asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(watch(settings, seen, done_watching))
    sender = asyncio.create_task(_traffic(settings, ids, done_sending))
    breaker = asyncio.create_task(_broken(settings, done_sending))
    await asyncio.sleep(3.0)  # traffic before the first fault
    fault_at = time.monotonic()
    if fault == "rolling-restart":
        restarted = [1, 2, 3]
        for node_id in restarted:
            await asyncio.to_thread(cluster.restart, node_id)
            await _fully_replicated(bootstrap, everything)
    else:
        leader = next(
            p["leader"] for p in await _partitions(bootstrap, [t.retrieval]) if p["partition"] == 0
        )
        restarted = [leader]
        await asyncio.to_thread(cluster.restart, leader, kill=True)
        await _fully_replicated(bootstrap, everything)
    faults_s = time.monotonic() - fault_at
    await asyncio.sleep(3.0)  # traffic after the last fault
    done_sending.set()
    waited, broken = await sender, await breaker
    ends = await end_offsets(bootstrap, [t.retrieval, t.generation], PARTITIONS)
    # the client lost nothing and wrote nothing twice, nor did the sloppy producer
    assert sum(ends.values()) == 2 * len(ids) + len(broken)
    late = [w for w in waited if not w.from_sidecar]
    assert not late, late[:3]  # every wait ended with the sidecar's verdict

    await wait_until(lambda: set(seen.count) >= set(ids), 60, "a verdict for every request")
    await asyncio.sleep(2.0)  # late repeats, if any
    done_watching.set()
    await watcher

    logs = [p.log.read_text(errors="replace") for p in fleet]
    assert all(p.pid is not None and p.ready() for p in fleet), [p.tail() for p in fleet]
    assert await end_offsets(bootstrap, [t.retrieval, t.generation], PARTITIONS) == ends
    assert set(seen.count) == set(ids)  # every request decided
    torn = sorted(seen.incomplete)
    assert not torn, (len(torn), {rid: seen.messages[rid] for rid in torn[:3]})
    assert all(len(keys) == 1 for keys in seen.keys.values())  # repeats carry the same key
    # each broken record dead-lettered once, with its reason, whatever moved meanwhile
    dead = await read_settled(bootstrap, t.dlq, settle_s=1.0)
    assert sorted(r.key.decode() for r in dead) == sorted(broken)
    assert {dict(r.headers).get("x-dlq-reason") for r in dead} == {b"malformed-json"}
    assert not any("Traceback" in log for log in logs), [log[-3000:] for log in logs]
    # a routine restart is no error of the sidecar's (aiokafka logged 13-23 per sidecar)
    lines = [line for log in logs for line in log.splitlines()]
    assert not [line for line in lines if " ERROR " in line]
    # nor of the service's, which opted in (calm_kafka_logs): its ERROR handler heard nothing
    # from the Kafka client, which logged the same retried lines as the sidecars' did
    warned, alerted = service_logs
    client = [r for r in warned.records if r.name.startswith("aiokafka")]
    assert not [r.getMessage() for r in alerted.records if r.name.startswith("aiokafka")]
    notes = tuple(f"({d.note})" for d in DEMOTIONS)
    demoted = sum(any(note in r.getMessage() for note in notes) for r in client)
    for p in fleet:  # they stop as a pod's SIGTERM stops them, after all that
        assert await asyncio.to_thread(p.signal, signal.SIGTERM) == 0, p.tail()
    print(  # the measurement the closing note quotes (pytest -s)
        f"\n{fault}: nodes {restarted} in {faults_s:.1f} s; {len(ids)} requests, "
        f"{sum(seen.count.values())} verdicts, {seen.duplicates} repeats (same key), "
        f"{len(seen.incomplete)} incomplete, {len(dead)} dead letters of {len(broken)} "
        f"broken records; the client waited {_spread(waited)}; "
        f"{sum(' WARNING ' in line for line in lines)} WARNING lines in the sidecars' logs, "
        f"{len(client)} of the Kafka client's in the service's ({demoted} of them ERRORs the "
        f"opt-in demoted; most logged: {Counter(str(r.msg)[:60] for r in client).most_common(2)})"
    )
