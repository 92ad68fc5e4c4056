"""An input topic deleted under the running loop and created again under the same name.

The probe tells the service (``_forget_inputs``); what was read from the deleted topic
must never finish, or be committed as, a record of the topic created again: its offsets
start over at 0 and name other records.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from aiokafka import ConsumerRecord
from faststream.kafka import TestKafkaBroker

from sidecar.kafka.app import SidecarService
from sidecar.kafka.intake import Records
from sidecar.pipeline.outputs import Step
from sidecar.pipeline.processor import BatchItem, Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import settings_for, wait_until


def _service(names: dict[str, str]) -> SidecarService:
    settings = settings_for(names)
    service = SidecarService(settings, Processor(settings, PlaceholderPolicy()))
    t = settings.topics
    service.state.assigned = {(t.retrieval, 0), (t.generation, 0)}
    return service


def _read(topic: str, offset: int, event: dict[str, object]) -> Records:
    key, value = str(event["request_id"]).encode(), dumps(event)
    record = ConsumerRecord(
        topic=topic, partition=0, offset=offset, timestamp=0, timestamp_type=0,
        key=key, value=value, checksum=None, serialized_key_size=len(key),
        serialized_value_size=len(value), headers=(),
    )  # fmt: skip
    return (record,)


async def test_a_request_read_before_its_topic_was_deleted_finishes_nothing_of_the_new_one(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """req-old's retrieval was read at offset 0 of the retrieval topic, which was then
    deleted and created again; req-new's retrieval is offset 0 of the new topic. Deciding
    req-old finished ``(retrieval, 0)``, offset 0 (before: the new record's, so the commit
    moved past req-new with no verdict for it; a crash then lost it)."""
    service = _service(unique_topics)
    t = service.settings.topics
    retrieval = (t.retrieval, 0)
    async with TestKafkaBroker(service.broker):
        await service._handle(_read(t.retrieval, 0, retrieval_event("req-old")))
        await wait_until(lambda: len(service.processor.store) == 1, 5, "req-old open")
        service._forget_inputs({t.retrieval})
        await service._handle(_read(t.retrieval, 0, retrieval_event("req-new")))
        await service._handle(_read(t.generation, 0, final_event("req-old")))
        await wait_until(lambda: not service.tracker.pending_offsets((t.generation, 0)), 5)
        assert service.processor.counters.verdicts == 1  # req-old, decided
        assert service.tracker.pending_offsets(retrieval) == [0]  # req-new's, still open
        assert service.tracker.low_water(retrieval) == 0


async def test_a_batch_being_decided_when_its_topic_is_deleted_finishes_nothing_of_the_new_one(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """The worker thread is deciding req-old (both halves in one batch) when the retrieval
    topic is deleted; req-new's retrieval, offset 0 of the topic created again, is read
    meanwhile. The batch's refs were taken before: req-old's verdict, confirmed after,
    leaves req-new's offset pending."""
    service = _service(unique_topics)
    t = service.settings.topics
    retrieval = (t.retrieval, 0)
    processor = service.processor
    deciding, release = threading.Event(), threading.Event()
    on_part = processor.on_part

    def held_on_part(
        items: Sequence[BatchItem], start: int, now_ms: float, budget_ns: int | None
    ) -> tuple[Step, int]:
        deciding.set()
        release.wait(5)
        return on_part(items, start, now_ms, budget_ns)

    processor.on_part = held_on_part  # type: ignore[method-assign]
    async with TestKafkaBroker(service.broker):
        old = _read(t.retrieval, 0, retrieval_event("req-old"))
        await service._handle(old + _read(t.generation, 0, final_event("req-old")))
        assert await asyncio.to_thread(deciding.wait, 5)
        service._forget_inputs({t.retrieval})
        await service._handle(_read(t.retrieval, 0, retrieval_event("req-new")))
        release.set()
        await wait_until(lambda: not service.tracker.pending_offsets((t.generation, 0)), 5)
        assert processor.counters.verdicts == 1  # req-old's
        assert service.tracker.pending_offsets(retrieval) == [0]  # req-new's, still open
        assert service.tracker.low_water(retrieval) == 0


async def test_records_still_queued_from_a_deleted_topic_are_dropped(
    unique_topics: dict[str, str], retrieval_event: EventFactory
) -> None:
    """Records of the deleted topic that wait for the processor would open requests whose
    offsets name records of the new topic: they go, the live topic's stay."""
    service = _service(unique_topics)
    t = service.settings.topics
    service.queue.put(
        _read(t.retrieval, 4, retrieval_event("req-a"))
        + _read(t.generation, 7, retrieval_event("req-b"))
    )
    service._forget_inputs({t.retrieval})
    assert service.queue.records == 1
    [kept] = await service.queue.get()
    assert (kept.topic, kept.offset) == (t.generation, 7)


async def test_a_batch_the_drainer_holds_from_a_deleted_topic_is_dropped(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """The drainer took req-old's records from the queue and waits for the handler lock when
    the topic is deleted: tagged when processed, they would carry the new topic's
    incarnation, and finish offset 0 of the topic created again (req-new's)."""
    service = _service(unique_topics)
    t = service.settings.topics
    retrieval = (t.retrieval, 0)
    async with TestKafkaBroker(service.broker):
        await service._handler_lock.acquire()  # a batch in hand
        await service._handle(
            _read(t.retrieval, 0, retrieval_event("req-old"))
            + _read(t.generation, 0, final_event("req-old"))
        )
        await wait_until(lambda: service.queue.records == 0, 5, "the drainer took the batch")
        service._forget_inputs({t.retrieval})
        await service._handle(_read(t.retrieval, 0, retrieval_event("req-new")))
        service._handler_lock.release()
        await wait_until(lambda: len(service.processor.store) == 2, 5, "both requests open")
        # req-old's final is read, its retrieval went with the topic; req-new's is the new one
        assert service.processor.counters.verdicts == 0
        assert service.tracker.pending_offsets(retrieval) == [0]
