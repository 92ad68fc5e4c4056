"""Fixtures of the client tests: a real sidecar process (``python -m sidecar run``) on a uuid
topic set, and fake aiokafka producers and consumers for the tests that need no broker."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bench.verdict_client import sidecar_env
from sidecar.config import Settings
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from tests.client.fakes import FakeConsumer, FakeProducer
from tests.kafka.harness import settings_for

SidecarFactory = Callable[..., SidecarProcess]


@pytest.fixture
async def client_settings(kafka_broker: LocalKafka, unique_topics: dict[str, str]) -> Settings:
    """The uuid topic set, created on the real broker."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    return settings


@pytest.fixture
async def start_sidecar(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> AsyncIterator[SidecarFactory]:
    """Starts a sidecar process on the test's topics (``extra`` env on top); stops them all."""
    started: list[SidecarProcess] = []
    topics = {k: v for k, v in unique_topics.items() if k != "group"}

    def start(**extra: str) -> SidecarProcess:
        env = {
            **sidecar_env(kafka_broker.bootstrap_servers, topics, unique_topics["group"]),
            "GUARDRAIL_JOIN__TTL_MS": "20000",
            **extra,
        }
        proc = SidecarProcess(env, tmp_path / f"sidecar{len(started)}.log")
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        if proc.pid is not None:
            await asyncio.to_thread(proc.signal, signal.SIGTERM)


@pytest.fixture
def fake_producers(monkeypatch: pytest.MonkeyPatch) -> list[FakeProducer]:
    """Every producer a publisher creates in this test is a ``FakeProducer``, listed here."""
    made: list[FakeProducer] = []

    def make(**options: Any) -> FakeProducer:
        made.append(FakeProducer(**options))
        return made[-1]

    monkeypatch.setattr("guardrail_client.publisher.AIOKafkaProducer", make)
    return made


@pytest.fixture
def fake_consumers(monkeypatch: pytest.MonkeyPatch) -> list[FakeConsumer]:
    """Every consumer a verdict client creates in this test is a ``FakeConsumer``, listed here."""
    made: list[FakeConsumer] = []

    def make(**options: Any) -> FakeConsumer:
        made.append(FakeConsumer(**options))
        return made[-1]

    monkeypatch.setattr("guardrail_client.verdicts.AIOKafkaConsumer", make)
    return made
