"""Explicit topic creation: the broker never auto-creates topics.

``rag.retrieval`` and ``rag.generation`` get the same partition count (they are
co-partitioned by request_id so one consumer sees both halves of a request).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from sidecar.config import Settings
from sidecar.exceptions import BrokerError, ConfigError
from sidecar.kafka.security import aiokafka_client_args

DLQ_RETENTION_MS = 14 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    big = str(settings.topics.max_message_bytes)
    return [
        TopicSpec(t.retrieval, t.partitions, {"max.message.bytes": big}),
        TopicSpec(t.generation, t.partitions, {"max.message.bytes": big}),
        TopicSpec(t.claims, t.partitions, {}),
        TopicSpec(t.verdicts, t.partitions, {}),
        TopicSpec(t.feedback, t.partitions, {}),
        TopicSpec(t.reports, 1, {}),
        TopicSpec(t.dlq, 1, {"max.message.bytes": big, "retention.ms": str(DLQ_RETENTION_MS)}),
    ]


async def create_topics(settings: Settings) -> dict[str, str]:
    """Create the sidecar's topics; returns name -> "created" | "exists"."""
    admin = AIOKafkaAdminClient(**aiokafka_client_args(settings.kafka))
    try:
        await admin.start()
    except KafkaError as exc:
        raise BrokerError(
            f"cannot reach Kafka at {settings.kafka.bootstrap_servers}: {exc}"
        ) from exc
    try:
        specs = topic_specs(settings)
        existing = set(await admin.list_topics())
        result = {s.name: "exists" for s in specs if s.name in existing}
        missing = [s for s in specs if s.name not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [
                        NewTopic(
                            name=s.name,
                            num_partitions=s.partitions,
                            replication_factor=settings.topics.replication_factor,
                            topic_configs=s.config,
                        )
                        for s in missing
                    ]
                )
            except TopicAlreadyExistsError:
                pass
            result.update({s.name: "created" for s in missing})
        await _check_copartitioned(admin, settings)
        return result
    finally:
        await admin.close()


async def _check_copartitioned(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    t = settings.topics
    names = [t.retrieval, t.generation, t.feedback]
    described = await admin.describe_topics(names)
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    if len({counts.get(n) for n in names}) != 1:
        shown = ", ".join(f"{n} has {counts.get(n)}" for n in names)
        raise ConfigError(
            f"partition counts differ ({shown}); they must be equal (co-partitioned by "
            "request_id, so one sidecar sees a request's events and its feedback)"
        )
