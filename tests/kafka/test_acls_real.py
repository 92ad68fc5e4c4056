"""The sidecar on a real broker that authorises (Kafka ACLs, StandardAuthorizer, SASL/SCRAM).

Before, every run here was against a broker that allows everything. Against one with
ACLs, a sidecar missing Read on an input topic or its group started, said it was ready,
and consumed nothing for ever (FastStream logs "Kafka error occurred" every 5 s and goes
on); one missing Write on its verdict or dead-letter topic went not live at its first
publish, after taking traffic, and restarted into the same end. Now the start checks
the principal's ACLs against what the sidecar will do, and a refusal while it runs makes
it not live.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from guardrail_client.exceptions import ClientBrokerError
from guardrail_client.keys import partition_for
from guardrail_client.publisher import GuardrailPublisher
from guardrail_client.verdicts import VerdictClient
from sidecar.config import TOPIC_ROLES, Settings
from sidecar.exceptions import ConfigError, SidecarNotReadyError
from sidecar.kafka.app import SidecarService
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.acls import (
    AUTHORIZER_PROPERTIES,
    Acl,
    Operation,
    Pattern,
    Resource,
    create_acls,
    delete_acls,
)
from sidecar.lab.localkafka.broker import LocalKafka, free_port
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps, kafka_lib
from tests.kafka.harness import committed, wait_until

pytestmark = pytest.mark.connected

USER, PASSWORD = "guardrail", "acl-Scram-Pa55word"
PRINCIPAL = f"User:{USER}"
LLM, LLM_PASSWORD = "llm-service", "llm-Scram-Pa55word"  # the LLM service's own principal


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A broker whose SASL listener authorises by ACL (its PLAINTEXT listener, the tests'
    own clients and the inter-broker traffic, are super users)."""
    instance = tmp_path_factory.mktemp("kafka-acl")
    broker = LocalKafka(
        instance,
        kafka_lib(),
        port=free_port(),
        controller_port=free_port(),
        sasl_port=free_port(),
        scram_users={USER: PASSWORD, LLM: LLM_PASSWORD},
        extra_properties=AUTHORIZER_PROPERTIES,
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(instance, ignore_errors=True)


def readme_acls(topics: dict[str, str]) -> list[Acl]:
    """The ACLs README "Kafka ACLs" lists for the default configuration (claims included,
    so the claim check can be turned on)."""

    def topic(role: str, *operations: Operation) -> list[Acl]:
        return [Acl(PRINCIPAL, Resource.TOPIC, topics[role], op) for op in operations]

    read, write = Operation.READ, Operation.WRITE
    return [
        Acl(PRINCIPAL, Resource.GROUP, topics["group"], read),
        *topic("retrieval", read, write),
        *topic("generation", read, write),
        *topic("feedback", read, write),
        *topic("verdicts", read, write),
        *topic("claims", write),
        *topic("dlq", write),
        *topic("reports", write),
        *topic("certificates", read, write),
    ]


def _without(acls: list[Acl], topics: dict[str, str], dropped: str) -> list[Acl]:
    """``acls`` less the one named ``role:operation`` (``group:READ``, ``dlq:WRITE``)."""
    role, operation = dropped.split(":")
    name = topics[role]
    kept = [a for a in acls if not (a.name == name and a.operation.name == operation)]
    assert len(kept) == len(acls) - 1
    return kept


def sasl_env(broker: LocalKafka, topics: dict[str, str]) -> dict[str, str]:
    assert broker.sasl_bootstrap_servers is not None
    return {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": broker.sasl_bootstrap_servers,
        "GUARDRAIL_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GUARDRAIL_KAFKA__SASL_MECHANISM": "SCRAM-SHA-256",
        "GUARDRAIL_KAFKA__SASL_USERNAME": USER,
        "GUARDRAIL_KAFKA__SASL_PASSWORD": PASSWORD,
        "GUARDRAIL_KAFKA__GROUP_ID": topics["group"],
        **{f"GUARDRAIL_TOPICS__{n.upper()}": topics[n] for n in TOPIC_ROLES},
    }


def _as_sidecar(broker: LocalKafka, **extra: str) -> dict[str, Any]:
    """The ``kafka`` settings of the sidecar's principal, on the SASL listener."""
    return {
        "bootstrap_servers": broker.sasl_bootstrap_servers,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": USER,
        "sasl_password": PASSWORD,
        **extra,
    }


async def _prepare(broker: LocalKafka, topics: dict[str, str], acls: list[Acl]) -> Settings:
    """The topics (made by the super user) and ``acls``; the super user's settings."""
    settings = Settings.load(
        kafka={"bootstrap_servers": broker.bootstrap_servers, "group_id": topics["group"]},
        topics={n: topics[n] for n in TOPIC_ROLES},
    )
    await create_topics(settings)
    await create_acls(broker.bootstrap_servers, acls)
    return settings


async def _records(bootstrap: str, topic: str, want: int, timeout_s: float = 30.0) -> list[object]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    got: list[object] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            got.extend(r for records in batch.values() for r in records)
    finally:
        await consumer.stop()
    return got


async def _produce(bootstrap: str, *records: tuple[str, bytes, bytes, int | None]) -> None:
    """``(topic, value, key, partition)`` each, as the super user (None: the key's)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for topic, value, key, partition in records:
            await producer.send_and_wait(topic, value, key, partition=partition)
    finally:
        await producer.stop()


def _request(topics: Any, rid: str, retrieval: EventFactory, final: EventFactory) -> list[Any]:
    """A request's retrieval and final event, for :func:`_produce`."""
    key = rid.encode()
    return [
        (topics.retrieval, dumps(retrieval(rid)), key, None),
        (topics.generation, dumps(final(rid)), key, None),
    ]


def _live(process: SidecarProcess) -> int:
    try:
        url = f"http://127.0.0.1:{process.port}/livez"
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


async def test_with_the_acls_the_readme_lists_the_sidecar_decides_and_dead_letters(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = await _prepare(acl_broker, unique_topics, readme_acls(unique_topics))
    t = settings.topics
    sidecar = SidecarProcess(sasl_env(acl_broker, unique_topics), tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start, 60)
    try:
        await _produce(
            acl_broker.bootstrap_servers,
            *_request(t, "acl-1", retrieval_event, final_event),
            (t.generation, b"{not json", b"acl-2", None),
        )
        verdicts = await _records(acl_broker.bootstrap_servers, t.verdicts, 1)
        dead = await _records(acl_broker.bootstrap_servers, t.dlq, 1)
        assert [getattr(v, "key", None) for v in verdicts] == [b"acl-1"]
        assert [dict(getattr(d, "headers", ()))["x-dlq-reason"] for d in dead] == [
            b"malformed-json"
        ]
        group = unique_topics["group"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            offsets = await committed(acl_broker.bootstrap_servers, group)
            if sum(offsets.get((t.generation, p), 0) for p in range(3)) == 2:
                break
            await asyncio.sleep(0.5)
        assert sum(offsets.get((t.generation, p), 0) for p in range(3)) == 2
        assert _live(sidecar) == 200
    finally:
        assert sidecar.signal(signal.SIGTERM) == 0
    log = (tmp_path / "sidecar.log").read_text()
    assert "does not allow" not in log  # no ACL said missing, not even the optional ones


@pytest.mark.parametrize(
    "dropped",
    [
        "group:READ",
        "retrieval:READ",
        "feedback:READ",
        "verdicts:WRITE",
        "dlq:WRITE",
        "reports:WRITE",
        "certificates:READ",
    ],
)
async def test_a_missing_acl_ends_the_start_naming_it_and_how_to_grant_it(
    acl_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path, dropped: str
) -> None:
    """Before, each of these started and said it was ready: Read missing, it consumed
    nothing for ever; Write missing, it went not live at its first publish."""
    acls = _without(readme_acls(unique_topics), unique_topics, dropped)
    await _prepare(acl_broker, unique_topics, acls)
    sidecar = SidecarProcess(sasl_env(acl_broker, unique_topics), tmp_path / "sidecar.log")
    with pytest.raises(SidecarNotReadyError):
        await asyncio.to_thread(sidecar.start, 45)
    assert sidecar.proc is not None and sidecar.proc.returncode == 2  # a configuration error
    log = (tmp_path / "sidecar.log").read_text()
    role, operation = dropped.split(":")
    kind = "group" if role == "group" else "topic"
    name = unique_topics[role]
    said = operation.capitalize()
    assert f"{said} on {kind} {name}" in log, log[-3000:]
    assert f"--allow-principal {PRINCIPAL} --operation {said} --{kind} {name}" in log
    assert "1 operation(s) it needs" in log  # only the one dropped
    assert PASSWORD not in log


async def _serves_one(
    acl_broker: LocalKafka,
    topics: dict[str, str],
    acls: list[Acl],
    tmp_path: Path,
    events: tuple[EventFactory, EventFactory],
) -> str:
    """Start the sidecar with ``acls``, have it decide one request, stop it; its log."""
    settings = await _prepare(acl_broker, topics, acls)
    sidecar = SidecarProcess(sasl_env(acl_broker, topics), tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start, 60)
    try:
        await _produce(acl_broker.bootstrap_servers, *_request(settings.topics, "one", *events))
        assert len(await _records(acl_broker.bootstrap_servers, settings.topics.verdicts, 1)) == 1
    finally:
        assert sidecar.signal(signal.SIGTERM) == 0
    return (tmp_path / "sidecar.log").read_text()


async def test_without_write_on_the_inputs_it_serves_and_warns_about_rerouting(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    acls = readme_acls(unique_topics)
    for role in ("retrieval", "generation", "feedback"):
        acls = _without(acls, unique_topics, f"{role}:WRITE")
    log = await _serves_one(
        acl_broker, unique_topics, acls, tmp_path, (retrieval_event, final_event)
    )
    warned = [line for line in log.splitlines() if "dead-lettered reroute-refused" in line]
    assert len(warned) == 1 and "WARNING" in warned[0], log[-3000:]
    for role in ("retrieval", "generation", "feedback"):
        assert f"Write on topic {unique_topics[role]}" in warned[0]
    assert "GUARDRAIL_JOIN__REROUTE=false" in warned[0]


async def test_without_read_on_the_verdicts_it_serves_with_empty_monitor_windows(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Read on the verdicts topic is for the exchangeability monitor's warm start only: one
    WARNING names it, the read is not tried (aiokafka would log each refused fetch)."""
    acls = _without(readme_acls(unique_topics), unique_topics, "verdicts:READ")
    log = await _serves_one(
        acl_broker, unique_topics, acls, tmp_path, (retrieval_event, final_event)
    )
    warned = [line for line in log.splitlines() if "does not allow" in line]
    assert len(warned) == 1 and "WARNING" in warned[0], log[-3000:]
    verdicts = unique_topics["verdicts"]
    assert (
        f"Read on topic {verdicts}: the exchangeability monitor's windows start empty"
        in (warned[0])
    )
    assert f"--operation Read --topic {verdicts}" in warned[0]
    assert "Not authorized" not in log and "warm start" not in log


async def test_a_topic_it_may_not_even_describe_is_not_said_to_be_missing(
    acl_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """No ACL at all on the claims topic: it is left out of the cluster's topic list for
    this principal, and the start said it did not exist ("create them first")."""
    acls = _without(readme_acls(unique_topics), unique_topics, "claims:WRITE")
    await _prepare(acl_broker, unique_topics, acls)
    sidecar = SidecarProcess(sasl_env(acl_broker, unique_topics), tmp_path / "sidecar.log")
    with pytest.raises(SidecarNotReadyError):
        await asyncio.to_thread(sidecar.start, 45)
    assert sidecar.proc is not None and sidecar.proc.returncode == 2
    log = (tmp_path / "sidecar.log").read_text()
    claims = unique_topics["claims"]
    said = f"Describe on topic {claims} (checked to exist at start; not even Describe now)"
    assert said in log, log[-3000:]
    assert f"--operation Describe --topic {claims}" in log and "1 operation(s) it needs" in log
    assert "do not exist on" not in log


@pytest.mark.parametrize("revoked", ["generation:READ", "group:READ", "certificates:READ"])
async def test_an_acl_removed_while_it_serves_makes_it_not_live(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    revoked: str,
) -> None:
    """Before, it went on fetching every 5 s, consuming nothing, ready and live."""
    acls = readme_acls(unique_topics)
    settings = await _prepare(acl_broker, unique_topics, acls)
    sidecar = SidecarProcess(sasl_env(acl_broker, unique_topics), tmp_path / "sidecar.log")
    await asyncio.to_thread(sidecar.start, 60)
    try:
        gone = [a for a in acls if a not in _without(acls, unique_topics, revoked)]
        assert await delete_acls(acl_broker.bootstrap_servers, gone) == 1
        await _produce(
            acl_broker.bootstrap_servers,
            *_request(settings.topics, "r-1", retrieval_event, final_event),
        )
        deadline = time.monotonic() + 30
        while _live(sidecar) == 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert _live(sidecar) == 503
        assert not sidecar.ready()
    finally:
        sidecar.signal(signal.SIGTERM)
    log = (tmp_path / "sidecar.log").read_text()
    fatal = [line for line in log.splitlines() if "FATAL the Kafka cluster refuses" in line]
    assert len(fatal) == 1, log[-3000:]
    role = revoked.split(":", maxsplit=1)[0]
    assert unique_topics[role] in fatal[0]


async def test_a_reroute_the_cluster_refuses_is_dead_lettered_and_the_loop_goes_on(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Two replicas, two partitions, no Write on the inputs: a final event written to the
    partition its request does not hash to is read by the replica that does not hold the
    request's retrieval; its copy is refused (TopicAuthorization), and the original is
    dead-lettered ``reroute-refused`` (the README's claim, not tried on a broker with
    ACLs before). Both replicas stay live and commit past it."""
    acls = readme_acls(unique_topics)
    for role in ("retrieval", "generation", "feedback"):
        acls = _without(acls, unique_topics, f"{role}:WRITE")
    await create_acls(acl_broker.bootstrap_servers, acls)
    topics = {n: unique_topics[n] for n in TOPIC_ROLES}
    admin = Settings.load(
        kafka={"bootstrap_servers": acl_broker.bootstrap_servers},
        topics={**topics, "partitions": 2},
    )
    await create_topics(admin)
    served = Settings.load(
        kafka=_as_sidecar(acl_broker, group_id=unique_topics["group"]),
        topics={**topics, "partitions": 2},
        join={"ttl_ms": 2_000, "sweep_interval_ms": 200},
        http={"enabled": False},
    )
    services = [SidecarService(served, Processor(served, PlaceholderPolicy())) for _ in range(2)]
    for s in services:
        await s.start()
    try:
        await wait_until(
            lambda: all(len(s.state.assigned) == 3 for s in services), 30, "both assigned"
        )
        rid = next(f"off-{i}" for i in range(100) if partition_for(f"off-{i}", 2) == 0)
        t = admin.topics
        here, there = _request(t, rid, retrieval_event, final_event)
        # the final on the partition its request does not hash to
        await _produce(acl_broker.bootstrap_servers, (*here[:3], 0), (*there[:3], 1))
        dead = await _records(acl_broker.bootstrap_servers, t.dlq, 1)
        assert len(dead) == 1
        headers = dict(getattr(dead[0], "headers", ()))
        assert headers["x-dlq-reason"] == b"reroute-refused", headers
        verdicts = await _records(acl_broker.bootstrap_servers, t.verdicts, 1)
        codes = [r["code"] for r in json.loads(getattr(verdicts[0], "value", b""))["reasons"]]
        assert "incomplete" in codes  # the retrieval's replica never got the final
        await wait_until(lambda: all(s.state.live for s in services), 5, "both live")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            offsets = await committed(acl_broker.bootstrap_servers, unique_topics["group"])
            if offsets.get((t.generation, 1)) == 1:
                break
            await asyncio.sleep(0.5)
        assert offsets.get((t.generation, 1)) == 1  # the refused original, committed
    finally:
        for s in services:
            await s.stop()


@pytest.mark.parametrize("dropped", [None, "dlq:WRITE"])
async def test_topics_acls_check_says_which_are_granted(
    acl_broker: LocalKafka, unique_topics: dict[str, str], dropped: str | None
) -> None:
    """``guardrail topics acls --check``: what the start checks, asked before deploying."""
    acls = readme_acls(unique_topics)
    if dropped is not None:
        acls = _without(acls, unique_topics, dropped)
    await _prepare(acl_broker, unique_topics, acls)
    env = {**os.environ, **sasl_env(acl_broker, unique_topics)}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", "topics", "acls", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    dlq = f"Write on topic {unique_topics['dlq']} (DLQ)"
    if dropped is None:
        assert done.returncode == 0, done.stderr
        assert lines and all(line.startswith("granted") for line in lines), lines
    else:
        assert done.returncode == 2, done.stderr
        assert [line for line in lines if not line.startswith("granted")] == [f"MISSING  {dlq}"]
        assert "1 ACL(s) the sidecar needs are not granted" in done.stderr
    assert any(f"Read on group {unique_topics['group']}" in line for line in lines)
    assert PASSWORD not in done.stdout + done.stderr


def _llm_options(broker: LocalKafka) -> dict[str, Any]:
    """The guardrail client's connection, as the LLM service's principal."""
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": LLM,
        "sasl_plain_password": LLM_PASSWORD,
    }


@pytest.mark.parametrize("generation", ["describe", "none"])
async def test_the_publisher_refuses_to_start_on_a_topic_it_may_not_write(
    acl_broker: LocalKafka, unique_topics: dict[str, str], generation: str
) -> None:
    """Before, it started, and every event to the topic failed with one warning each."""
    t = unique_topics
    acls = [Acl(f"User:{LLM}", Resource.TOPIC, t["retrieval"], Operation.WRITE)]
    if generation == "describe":
        acls.append(Acl(f"User:{LLM}", Resource.TOPIC, t["generation"], Operation.DESCRIBE))
    await _prepare(acl_broker, t, acls)
    assert acl_broker.sasl_bootstrap_servers is not None
    publisher = GuardrailPublisher(
        acl_broker.sasl_bootstrap_servers,
        generator_model="m",
        retrieval_topic=t["retrieval"],
        generation_topic=t["generation"],
        **_llm_options(acl_broker),
    )
    with pytest.raises(ClientBrokerError) as refused:
        await publisher.start()
    said = str(refused.value)
    assert f"principal (User:{LLM}) Write on topic {t['generation']}" in said
    assert f"--allow-principal User:{LLM} --operation Write --topic {t['generation']}" in said
    assert t["retrieval"] not in said.replace(t["generation"], "")  # that one is granted
    assert ("not even Describe" in said) is (generation == "none")
    assert LLM_PASSWORD not in said


async def test_the_verdict_client_refuses_to_start_on_a_topic_it_may_not_read(
    acl_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    t = unique_topics
    await _prepare(acl_broker, t, [Acl(f"User:{LLM}", Resource.TOPIC, t["claims"], Operation.READ)])
    assert acl_broker.sasl_bootstrap_servers is not None
    client = VerdictClient(
        acl_broker.sasl_bootstrap_servers,
        verdicts_topic=t["verdicts"],
        claims_topic=t["claims"],
        **_llm_options(acl_broker),
    )
    with pytest.raises(ClientBrokerError, match=f"Read on topic {t['verdicts']} \\(not even"):
        await client.start()


async def test_a_write_acl_removed_under_the_publisher_fails_events_without_a_line_each(
    acl_broker: LocalKafka, unique_topics: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every event to a topic the principal may no longer write fails; it was one warning
    per event in the LLM service's log (300 lines for 300 requests)."""
    t = unique_topics
    acls = [
        Acl(f"User:{LLM}", Resource.TOPIC, t[role], Operation.WRITE)
        for role in ("retrieval", "generation")
    ]
    await _prepare(acl_broker, t, acls)
    assert acl_broker.sasl_bootstrap_servers is not None
    publisher = GuardrailPublisher(
        acl_broker.sasl_bootstrap_servers,
        generator_model="m",
        retrieval_topic=t["retrieval"],
        generation_topic=t["generation"],
        **_llm_options(acl_broker),
    )
    await publisher.start()
    await delete_acls(acl_broker.bootstrap_servers, acls[1:])
    with caplog.at_level(logging.WARNING, logger="guardrail_client"):
        for i in range(300):
            await publisher.final(f"gone-{i}", "an answer")
        await publisher.stop()
    assert publisher.stats.failed == 300 and publisher.stats.delivered == 0
    said = [r.getMessage() for r in caplog.records if r.name.startswith("guardrail_client")]
    assert len(said) == 1, said
    assert "1 event(s) not delivered so far" in said[0] and "TopicAuthorizationFailed" in said[0]


async def test_topics_create_without_create_on_the_cluster_says_so(
    acl_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """Before, it printed "created" for all eight topics, created none and exited 0."""
    assert acl_broker.sasl_bootstrap_servers is not None
    as_sidecar = Settings.load(
        kafka=_as_sidecar(acl_broker),
        topics={n: unique_topics[n] for n in TOPIC_ROLES},
    )
    with pytest.raises(ConfigError) as refused:
        await create_topics(as_sidecar)
    said = str(refused.value)
    assert "the broker refused to create 8 topic(s)" in said and "TopicAuthorization" in said
    assert f"--allow-principal {PRINCIPAL} --operation Create --cluster" in said
    grant = Acl(PRINCIPAL, Resource.CLUSTER, "kafka-cluster", Operation.CREATE)
    await create_acls(acl_broker.bootstrap_servers, [grant])
    try:
        made = await create_topics(as_sidecar)
    finally:
        await delete_acls(acl_broker.bootstrap_servers, [grant])
    assert set(made.values()) == {"created"} and len(made) == 8


async def test_a_read_acl_removed_under_the_verdict_client_is_said_once_then_its_end(
    acl_broker: LocalKafka, unique_topics: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Every failed fetch wrote a warning, two a second, for as long as the ACL was gone."""
    t = unique_topics
    read = Acl(f"User:{LLM}", Resource.TOPIC, t["verdicts"], Operation.READ)
    await _prepare(acl_broker, t, [read])
    assert acl_broker.sasl_bootstrap_servers is not None
    client = VerdictClient(
        acl_broker.sasl_bootstrap_servers,
        verdicts_topic=t["verdicts"],
        claims_topic=None,
        **_llm_options(acl_broker),
    )
    await client.start()
    try:
        await _produce(acl_broker.bootstrap_servers, (t["verdicts"], b"{}", b"x", None))
        await wait_until(lambda: client.records_read == 1, 30, "the first record read")
        with caplog.at_level(logging.WARNING, logger="guardrail_client"):
            await delete_acls(acl_broker.bootstrap_servers, [read])
            await asyncio.sleep(4.0)  # ~8 failed fetches
            failing = [m for m in caplog.messages if "fetch(es) failed in a row" in m]
            assert len(failing) == 1 and "TopicAuthorizationFailed" in failing[0], failing
            await create_acls(acl_broker.bootstrap_servers, [read])

            def again() -> list[str]:
                return [m for m in caplog.messages if "reading again after" in m]

            await wait_until(lambda: bool(again()), 30, "said reading again")
            assert len(again()) == 1
        await _produce(acl_broker.bootstrap_servers, (t["verdicts"], b"{}", b"y", None))
        await wait_until(lambda: client.records_read == 2, 30, "read again")
    finally:
        await client.stop()


@pytest.mark.parametrize("command", [["dlq", "inspect"], ["verdicts"], ["certificates", "list"]])
async def test_a_reader_the_cluster_refuses_names_the_read_grant(
    acl_broker: LocalKafka, unique_topics: dict[str, str], command: list[str]
) -> None:
    """With the sidecar's own ACLs less Read on the three (Write on the DLQ and the
    verdicts), reading them back is refused: exit 1, the broker's error and now the grant
    it needs."""
    t = unique_topics
    acls = [a for a in readme_acls(t) if a.name != t["certificates"]]
    acls = _without(acls, t, "verdicts:READ")  # Read on none of the 3
    acls += [Acl(PRINCIPAL, Resource.TOPIC, t["certificates"], Operation.WRITE)]
    await _prepare(acl_broker, t, acls)
    topic = {"dlq": t["dlq"], "verdicts": t["verdicts"], "certificates": t["certificates"]}[
        command[0]
    ]
    await _produce(acl_broker.bootstrap_servers, (topic, b"{}", b"k", None))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", *command],
        env={**os.environ, **sasl_env(acl_broker, t)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "TopicAuthorizationFailedError" in done.stderr
    assert f"--allow-principal {PRINCIPAL} --operation Read --topic {topic}" in done.stderr


# ------------------------------------------------------------------ prefixed ACLs


def prefixed_acls(topics: dict[str, str], principal: str = PRINCIPAL) -> list[Acl]:
    """What a KafkaUser with ``patternType: prefix`` grants (Strimzi; ``kafka-acls
    --resource-pattern-type prefixed``): Read and Write on every topic whose name starts
    with the topics' common prefix, Read on every group starting with the group's."""
    prefix = topics["retrieval"].rsplit(".", 1)[0] + "."  # t.<suffix>.
    on = [
        Acl(principal, Resource.TOPIC, prefix, op, Pattern.PREFIXED)
        for op in (Operation.READ, Operation.WRITE)
    ]
    return [
        *on,
        Acl(principal, Resource.GROUP, topics["group"][:-3], Operation.READ, Pattern.PREFIXED),
    ]


async def test_prefixed_acls_are_enough_for_the_sidecar_and_its_warm_start(
    acl_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """Every grant is a prefix, none names a topic or the group: the start's check asks the
    broker, which applies the prefixes, so nothing is said to be missing; the second
    start reads the first one's verdict back."""
    acls = prefixed_acls(unique_topics)
    log = await _serves_one(
        acl_broker, unique_topics, acls, tmp_path, (retrieval_event, final_event)
    )
    again = SidecarProcess(sasl_env(acl_broker, unique_topics), tmp_path / "again.log")
    await asyncio.to_thread(again.start, 60)
    assert again.signal(signal.SIGTERM) == 0
    second = (tmp_path / "again.log").read_text()
    for text in (log, second):
        assert "does not allow" not in text and "Not authorized" not in text, text[-3000:]
    assert "warm start: the last 1 record(s)" in second, second[-3000:]


async def test_a_topic_outside_the_granted_prefix_is_named_at_start(
    acl_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """The same prefixes, with the dead-letter topic named outside them: refused at start,
    naming that topic alone (a prefix is applied, not taken as "some ACL exists")."""
    topics = unique_topics | {"dlq": unique_topics["dlq"].replace("t.", "other.", 1)}
    await _prepare(acl_broker, topics, prefixed_acls(unique_topics))
    sidecar = SidecarProcess(sasl_env(acl_broker, topics), tmp_path / "sidecar.log")
    with pytest.raises(SidecarNotReadyError):
        await asyncio.to_thread(sidecar.start, 45)
    assert sidecar.proc is not None and sidecar.proc.returncode == 2
    log = (tmp_path / "sidecar.log").read_text()
    assert f"--operation Write --topic {topics['dlq']}" in log, log[-3000:]
    assert "1 operation(s) it needs" in log


async def test_the_clients_start_on_prefixed_acls(
    acl_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """The LLM service's publisher and verdict client, granted by prefix only."""
    t = unique_topics
    await _prepare(acl_broker, t, prefixed_acls(t, f"User:{LLM}"))
    assert acl_broker.sasl_bootstrap_servers is not None
    publisher = GuardrailPublisher(
        acl_broker.sasl_bootstrap_servers,
        generator_model="m",
        retrieval_topic=t["retrieval"],
        generation_topic=t["generation"],
        **_llm_options(acl_broker),
    )
    client = VerdictClient(
        acl_broker.sasl_bootstrap_servers,
        verdicts_topic=t["verdicts"],
        claims_topic=t["claims"],
        **_llm_options(acl_broker),
    )
    await publisher.start()
    try:
        await client.start()
        await client.stop()
    finally:
        await publisher.stop()
