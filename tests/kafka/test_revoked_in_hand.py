"""A revocation while the drainer holds a batch it took from the queue.

The drainer takes a batch from the queue, then waits for the handler lock; a revocation
waiting for the batch in the processor gets the lock first, commits without that batch's
records and forgets their offsets. Processed after it, their requests would be decided
again by the partitions' new owner, which re-reads them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

import pytest
from faststream.kafka import TestKafkaBroker

from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem
from tests.conftest import EventFactory
from tests.kafka.harness import wait_until
from tests.kafka.test_topic_deleted import _read, _service


async def no_commit(only: set[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
    """``SidecarService.commit`` that commits nothing (a test's offsets stay pending)."""
    del only
    return {}


async def test_a_batch_taken_from_the_queue_before_a_revocation_is_left_to_the_new_owner(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    service = _service(unique_topics)
    t = service.settings.topics
    processor = service.processor
    deciding, release = threading.Event(), threading.Event()
    on_part = processor.on_part

    def held_on_part(
        items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        if any(b'"req-a"' in (value or b"") for _, value, _, _ in items[start:]):
            deciding.set()
            release.wait(5)
        return on_part(items, start, now_ms, budget_ns)

    processor.on_part = held_on_part  # type: ignore[method-assign]
    service.commit = no_commit  # type: ignore[method-assign]
    revoked = {(t.retrieval, 0), (t.generation, 0)}
    async with TestKafkaBroker(service.broker):
        await service._handle(
            _read(t.retrieval, 0, retrieval_event("req-a"))
            + _read(t.generation, 0, final_event("req-a"))
        )
        assert await asyncio.to_thread(deciding.wait, 5)  # req-a is in the processor
        revoking = asyncio.create_task(service.on_revoked(revoked))
        await asyncio.sleep(0.05)  # it waits for the batch in hand
        # a batch fetched before the revocation, handed over while it runs
        await service._handle(
            _read(t.retrieval, 1, retrieval_event("req-b"))
            + _read(t.generation, 1, final_event("req-b"))
        )
        release.set()
        await asyncio.wait_for(revoking, 10)
        await wait_until(lambda: service.queue.records == 0, 5, "the queue drained")
        await asyncio.sleep(0.2)  # room for the drainer to process what it held
        assert processor.counters.verdicts == 1  # req-a's; req-b is the new owner's
        assert len(processor.store) == 0


async def test_a_call_left_to_run_after_the_batch_in_hand_says_when_it_fails(
    unique_topics: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """After the wait for the batch in hand timed out, the revocation hands the drop of its
    partitions' open requests to the worker and goes on; its failure went unseen (review)."""
    service = _service(unique_topics)
    ran = threading.Event()

    def broken() -> None:
        ran.set()
        raise RuntimeError("drop failed")

    with caplog.at_level(logging.ERROR, logger="sidecar"):
        service._after_batch_in_hand(broken)
        assert await asyncio.to_thread(ran.wait, 5)
        await wait_until(lambda: "drop failed" in caplog.text, 5, "the failure logged")
    assert "a processor call nobody waited for failed" in caplog.text
