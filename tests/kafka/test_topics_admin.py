"""``verify_topics``: closes its admin client when cancelled while connecting (SIGTERM at
start), and names input topics that accept compressed batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka import topics
from sidecar.kafka.read import read_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.kafka.harness import settings_for


class HangingAdmin:
    """An admin client whose broker never answers."""

    instances: ClassVar[list[HangingAdmin]] = []

    def __init__(self, **kwargs: Any) -> None:
        del kwargs
        self.closed = False
        HangingAdmin.instances.append(self)

    async def start(self) -> None:
        await asyncio.sleep(3600)

    async def close(self) -> None:
        self.closed = True


# every admin client start: the run's check, `guardrail topics create`, and the offline
# reader of `guardrail train confidence --from-kafka`
STEPS: dict[str, Callable[[Settings], Coroutine[Any, Any, object]]] = {
    "verify_topics": topics.verify_topics,
    "create_topics": topics.create_topics,
    "read_topics": lambda settings: read_topics(settings, ["rag.verdicts"]),
}


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_cancelled_start_closes_the_admin_client(
    monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    monkeypatch.setattr(topics, "AIOKafkaAdminClient", HangingAdmin)
    HangingAdmin.instances.clear()
    task = asyncio.create_task(STEPS[step](Settings.load()))
    while not HangingAdmin.instances:
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [admin] = HangingAdmin.instances
    assert admin.closed


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_broker_that_never_answers_is_given_up_on_within_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """``guardrail topics create`` and the offline reader waited on a silent broker for as
    long as aiokafka's own connection attempts went on; they now wait the request timeout,
    as ``run`` does."""
    monkeypatch.setattr(topics, "AIOKafkaAdminClient", HangingAdmin)
    HangingAdmin.instances.clear()
    settings = Settings.load(kafka={"request_timeout_ms": 1000})
    with pytest.raises(BrokerError, match=r"cannot reach Kafka at .* within 1 s") as caught:
        await asyncio.wait_for(STEPS[step](settings), timeout=10)
    assert "__REQUEST_TIMEOUT_MS" in str(caught.value)
    [admin] = HangingAdmin.instances
    assert admin.closed


@pytest.mark.connected
async def test_input_topics_that_accept_compressed_batches_are_named_at_start(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await topics.create_topics(settings)
    with caplog.at_level(logging.WARNING, logger="sidecar.kafka.topics"):
        await topics.verify_topics(settings)
    assert "compression" not in caplog.text  # guardrail topics create: uncompressed
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    unique_topics["generation"],
                    configs={"compression.type": "producer"},
                )
            ]
        )
    finally:
        await admin.close()
    warnings: list[logging.LogRecord] = []
    for _ in range(50):  # the broker applies a config change a moment after confirming it
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sidecar.kafka.topics"):
            await topics.verify_topics(settings)
        warnings = [r for r in caplog.records if "compressed batches" in r.getMessage()]
        if warnings:
            break
        await asyncio.sleep(0.2)
    [warning] = warnings
    assert unique_topics["generation"] in warning.getMessage()
    assert unique_topics["retrieval"] not in warning.getMessage()


async def test_topics_the_broker_refuses_to_create_are_not_said_created(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """A replication factor above the brokers' count: every topic was said "created", the
    command exited 0, and nothing existed (the sidecar then refused to start)."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    too_many = settings_for(
        unique_topics, kafka_broker.bootstrap_servers, topics={"replication_factor": 3}
    )
    with pytest.raises(ConfigError) as refused:
        await topics.create_topics(too_many)
    said = str(refused.value)
    assert "the broker refused to create 8 topic(s)" in said
    assert "InvalidReplicationFactorError" in said
    assert "GUARDRAIL_TOPICS__REPLICATION_FACTOR=3 must be at most the number of brokers" in said
    created = await topics.create_topics(settings)  # nothing was made: all created now
    assert set(created.values()) == {"created"} and len(created) == 8
    assert set((await topics.create_topics(settings)).values()) == {"exists"}


class _Answer:
    def __init__(self, rows: list[tuple[str, int, str | None]]) -> None:
        self.rows = rows

    def to_object(self) -> dict[str, Any]:
        keys = ("topic", "error_code", "error_message")
        return {"topic_errors": [dict(zip(keys, row, strict=True)) for row in self.rows]}


def test_each_topic_is_said_as_the_broker_answered_it() -> None:
    settings = Settings.load(
        kafka={"bootstrap_servers": "k:9092", "security_protocol": "PLAINTEXT"}
    )
    asked = topics.topic_specs(settings)[:3]
    a, b, c = (s.name for s in asked)
    ok = _Answer([(a, 0, None), (b, 36, "exists"), (c, 0, None)])
    assert topics._created(settings, asked, ok) == {a: "created", b: "exists", c: "created"}
    assert topics._created(settings, asked, None) == dict.fromkeys((a, b, c), "exists")
    acl = _Answer(
        [(a, 0, None), (b, 29, "Authorization failed."), (c, 29, "Authorization failed.")]
    )
    with pytest.raises(ConfigError) as refused:
        topics._created(settings, asked, acl)
    said = str(refused.value)
    assert f"refused to create 2 topic(s): {b}, {c} (TopicAuthorizationFailedError" in said
    assert "--allow-principal User:PRINCIPAL --operation Create --cluster" in said
    assert said.endswith(f"({a} created)")  # what was made is said too
