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
from sidecar.exceptions import BrokerError
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
