"""Read whole topics once, from the beginning to the end offsets seen at the start.

For offline jobs (``guardrail train confidence --from-kafka``): no consumer
group, nothing committed, so reading never disturbs the serving sidecar.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from sidecar.config import Settings
from sidecar.kafka.security import aiokafka_client_args
from sidecar.kafka.topics import started_admin

__all__ = ["read_topics"]


async def read_topics(settings: Settings, topics: Sequence[str]) -> list[tuple[str, bytes]]:
    """``(topic, value)`` of every record of ``topics`` up to the current end, in offset order."""
    admin = await started_admin(settings.kafka)  # bounded, and a refusal said as such
    try:
        existing = set(await admin.list_topics())
        wanted = [t for t in topics if t in existing]
        described = await admin.describe_topics(wanted) if wanted else []
    finally:
        await admin.close()
    tps = [
        TopicPartition(d["topic"], p["partition"])
        for d in described
        for p in sorted(d["partitions"], key=lambda p: p["partition"])
    ]
    if not tps:
        return []
    consumer = AIOKafkaConsumer(
        **aiokafka_client_args(settings.kafka), enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[str, bytes]] = []
        # a partition whose records were all deleted (retention) has start == end
        remaining = {tp for tp in tps if ends[tp] > starts[tp]}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, records in batch.items():
                out.extend(
                    (tp.topic, rec.value)
                    for rec in records
                    if rec.offset < ends[tp] and rec.value is not None
                )
            for tp in list(remaining):
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        return out
    finally:
        await consumer.stop()
