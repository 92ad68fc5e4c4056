"""A revocation that waits for the processor takes the handler lock between two parts of
the batch in hand; the rest of the batch loses the revoked partitions' records, which
their new owner reads (before: the whole batch went through first, and the records of
the revoked partitions after the revocation's commit were decided here and again there).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from aiokafka import ConsumerRecord
from faststream.kafka import TestKafkaBroker

from sidecar.kafka.app import SidecarService
from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import settings_for, wait_until
from tests.kafka.test_revoked_in_hand import no_commit


def _record(topic: str, partition: int, event: dict[str, object]) -> ConsumerRecord[bytes, bytes]:
    key, value = str(event["request_id"]).encode(), dumps(event)
    return ConsumerRecord(
        topic=topic, partition=partition, offset=0, timestamp=0, timestamp_type=0,
        key=key, value=value, checksum=None, serialized_key_size=len(key),
        serialized_value_size=len(value), headers=(),
    )  # fmt: skip


async def test_a_revocation_between_two_parts_leaves_the_rest_of_the_batch_to_the_new_owner(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    settings = settings_for(unique_topics, kafka={"part_budget_ms": 1})
    processor = Processor(settings, PlaceholderPolicy())
    service = SidecarService(settings, processor)
    t = settings.topics
    service.state.assigned = {
        (t.retrieval, 0),
        (t.generation, 0),
        (t.retrieval, 1),
        (t.generation, 1),
    }
    admit = processor._admit

    def slow_admit(*args: object) -> None:
        time.sleep(0.002)  # past the 1 ms budget: a part a record
        admit(*args)  # type: ignore[arg-type]

    deciding, release = threading.Event(), threading.Event()
    on_part = processor.on_part
    parts: list[int] = []

    def held_on_part(
        items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        parts.append(start)
        value = items[start][1] or b""
        if b'"generation.final"' in value and b'"req-a"' in value:  # req-a's final
            deciding.set()
            release.wait(5)
        return on_part(items, start, now_ms, budget_ns)

    processor._admit = slow_admit  # type: ignore[method-assign, assignment]
    processor.on_part = held_on_part  # type: ignore[method-assign]
    service.commit = no_commit  # type: ignore[method-assign]
    revoked = {(t.retrieval, 1), (t.generation, 1)}
    async with TestKafkaBroker(service.broker):
        await service._handle(
            (
                _record(t.retrieval, 0, retrieval_event("req-a")),
                _record(t.generation, 0, final_event("req-a")),
                _record(t.retrieval, 1, retrieval_event("req-b")),
                _record(t.generation, 1, final_event("req-b")),
            )
        )
        assert await asyncio.to_thread(deciding.wait, 5)  # the part of req-a's final
        revoking = asyncio.create_task(service.on_revoked(revoked))
        await asyncio.sleep(0.05)  # it waits for the part in hand
        assert not revoking.done()
        release.set()
        await asyncio.wait_for(revoking, 10)
        await wait_until(lambda: service._revoked_in_hand is None, 5, "the batch through")
    assert parts == [0, 1]  # req-a's two records, each a part; then nothing of req-b's
    assert processor.counters.verdicts == 1  # req-a's; req-b is the new owner's
    assert processor.counters.consumed == 2
    assert len(processor.store) == 0
    assert not service.tracker.pending_offsets((t.retrieval, 0))
