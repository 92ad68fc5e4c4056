"""Pipelined publishing: a step's confirmations are awaited while the next batch is worked on.

A fake producer port hands out confirmations the test resolves, so what is
finished, and when, is observed directly (no broker, no timing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from sidecar.config import KafkaSettings
from sidecar.kafka.clients import AiokafkaProducerPort, Headers
from sidecar.kafka.publish import Publisher
from sidecar.kafka.readiness import LoopState
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.offsets import OffsetTracker
from sidecar.pipeline.outputs import Destination, Output, Step
from sidecar.telemetry import Telemetry

TP = ("in", 0)


class HeldProducer:
    """Every send is recorded and gets a confirmation the test resolves (or fails)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.confirmations: list[asyncio.Future[object]] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(
        self, topic: str, value: bytes, key: bytes | None, headers: Headers
    ) -> Awaitable[Any]:
        del topic, key, headers
        self.sent.append(value)
        confirmation: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.confirmations.append(confirmation)
        return confirmation

    async def topic_limits(self, topics: Iterable[str]) -> dict[str, int]:
        del topics
        return {}

    def confirm(self, index: int) -> None:
        self.confirmations[index].set_result(None)


STEPS_IN_FLIGHT = 4


def publisher(
    producer: HeldProducer,
    tracker: OffsetTracker,
    *,
    pipelined: bool,
    in_flight: int = STEPS_IN_FLIGHT,
) -> Publisher:
    return Publisher(
        producer,
        {d: f"out.{d.value}" for d in Destination},
        max_message_bytes=1_000_000,
        state=LoopState(),
        tracker=tracker,
        telemetry=Telemetry(),
        stopping=asyncio.Event(),
        pipelined=pipelined,
        in_flight=in_flight,
    )


def step(offset: int, outputs: int = 2) -> Step:
    """The step of one consumed record (``offset``) with ``outputs`` verdicts."""
    values = [f"{offset}.{i}".encode() for i in range(outputs)]
    return Step(
        outputs=[Output(Destination.VERDICTS, b"k", v, []) for v in values],
        done=[InputRef(topic=TP[0], partition=TP[1], offset=offset, headers=())],
    )


def consumed(tracker: OffsetTracker, offsets: range) -> OffsetTracker:
    for offset in offsets:
        tracker.track(TP, offset)
    return tracker


async def settled() -> None:
    for _ in range(5):  # let the confirmation tasks run
        await asyncio.sleep(0)


async def test_submit_returns_before_the_confirmations_and_finishes_the_inputs_after() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(2))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0))
    await pub.submit(step(1))
    assert producer.sent == [b"0.0", b"0.1", b"1.0", b"1.1"]  # both handed over, in order
    assert pub.in_flight == 2
    assert tracker.low_water(TP) == 0  # nothing confirmed: nothing may be committed
    producer.confirm(2)
    producer.confirm(3)
    await settled()
    assert tracker.low_water(TP) == 0  # step 1 is finished, step 0 still holds the mark
    assert pub.in_flight == 2  # the oldest is still waiting
    producer.confirm(0)
    producer.confirm(1)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.low_water(TP) == 2
    assert pub.in_flight == 0


async def test_at_most_steps_in_flight_the_next_submit_waits_for_the_oldest() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(STEPS_IN_FLIGHT + 1))
    pub = publisher(producer, tracker, pipelined=True)
    for offset in range(STEPS_IN_FLIGHT):
        await pub.submit(step(offset, outputs=1))
    extra = asyncio.create_task(pub.submit(step(STEPS_IN_FLIGHT, outputs=1)))
    await settled()
    assert not extra.done()
    assert len(producer.sent) == STEPS_IN_FLIGHT  # the extra step's output is not handed over
    producer.confirm(1)  # a younger step confirmed: the oldest still holds the room
    await settled()
    assert not extra.done()
    producer.confirm(0)
    await asyncio.wait_for(extra, timeout=1.0)
    assert producer.sent[-1] == f"{STEPS_IN_FLIGHT}.0".encode()
    assert pub.in_flight == STEPS_IN_FLIGHT - 1  # step 1 reaped once the oldest was


async def test_settle_reports_what_is_still_in_flight() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0))
    assert not await pub.settle(timeout_s=0.01)
    producer.confirm(0)
    producer.confirm(1)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0


async def test_a_failed_confirmation_is_retried_before_the_inputs_are_finished() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0))
    producer.confirmations[0].set_exception(KafkaTimeoutError())
    producer.confirm(1)
    await settled()
    assert producer.sent == [b"0.0", b"0.1", b"0.0"]  # the failed one, sent again alone
    assert tracker.pending_count() == 1
    producer.confirm(2)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0


async def test_none_in_flight_submit_returns_once_the_step_is_confirmed() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True, in_flight=0)
    submitting = asyncio.create_task(pub.submit(step(0)))
    await settled()
    assert producer.sent == [b"0.0", b"0.1"]  # handed over together, as pipelined
    assert not submitting.done()
    producer.confirm(0)
    producer.confirm(1)
    await asyncio.wait_for(submitting, timeout=1.0)
    assert tracker.pending_count() == 0
    assert pub.in_flight == 0


async def test_not_pipelined_submit_confirms_each_output_before_returning() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=False)
    submitting = asyncio.create_task(pub.submit(step(0)))
    await settled()
    assert producer.sent == [b"0.0"]  # one at a time: the second waits for the first
    producer.confirm(0)
    await settled()
    assert producer.sent == [b"0.0", b"0.1"]
    producer.confirm(1)
    await asyncio.wait_for(submitting, timeout=1.0)
    assert tracker.pending_count() == 0
    assert pub.in_flight == 0


async def test_a_step_without_outputs_finishes_its_inputs_without_waiting() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0, outputs=0))
    await settled()
    assert tracker.pending_count() == 0
    assert producer.sent == []


@pytest.mark.parametrize(
    ("setting", "request_size", "expected"),
    [
        (262_144, 1_114_112, 262_144),
        (4_000_000, 1_114_112, 1_114_112),  # never more than one request may carry
    ],
)
async def test_the_producer_batches_what_the_setting_says(
    setting: int, request_size: int, expected: int
) -> None:
    port = AiokafkaProducerPort(KafkaSettings(producer_batch_bytes=setting), request_size)
    try:  # aiokafka has no getter for it
        assert port._producer._message_accumulator._batch_size == expected
    finally:
        await port.stop()  # never started: closes what the constructor opened
