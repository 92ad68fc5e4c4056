"""Pipelined publishing: a step's confirmations are awaited while the next batch is worked on.

A fake producer port hands out confirmations the test resolves, so what is
finished, and when, is observed directly (no broker, no timing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
)

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
        self.topics: list[str] = []
        self.confirmations: list[asyncio.Future[object]] = []
        self.refuse_send: set[bytes] = set()  # values whose next send raises (once each)
        self.own_limits: dict[str, int] = {}  # what topic_limits reports
        self.resets = 0
        self.reset_batches: list[int | None] = []
        self.failing_resets = 0  # resets that raise before one succeeds

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(
        self, topic: str, value: bytes, key: bytes | None, headers: Headers
    ) -> Awaitable[Any]:
        del key, headers
        if value in self.refuse_send:
            self.refuse_send.discard(value)
            raise KafkaTimeoutError("buffer full")
        self.sent.append(value)
        self.topics.append(topic)
        confirmation: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.confirmations.append(confirmation)
        return confirmation

    async def topic_limits(self, topics: Iterable[str]) -> dict[str, int]:
        return {t: n for t, n in self.own_limits.items() if t in set(topics)}

    async def limit_batches(self, max_bytes: int) -> None:
        del max_bytes

    async def reset(self, max_batch_bytes: int | None = None) -> None:
        if self.failing_resets:
            self.failing_resets -= 1
            raise KafkaConnectionError("cannot start a producer")
        self.resets += 1
        self.reset_batches.append(max_batch_bytes)

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


def step(offset: int, outputs: int = 2, *, finishes: bool = True) -> Step:
    """The step of one consumed record (``offset``) with ``outputs`` verdicts.

    ``finishes=False``: a step that finishes no input (a streamed claim verdict's: its
    request's inputs are finished by the answer verdict's step).
    """
    values = [f"{offset}.{i}".encode() for i in range(outputs)]
    return Step(
        outputs=[Output(Destination.VERDICTS, b"k", v, []) for v in values],
        done=[InputRef(topic=TP[0], partition=TP[1], offset=offset, headers=())]
        if finishes
        else [],
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


async def test_no_step_finishes_its_inputs_while_an_earlier_step_is_being_retried() -> None:
    """A streamed claim verdict's step finishes no input; the answer verdict's step after it
    finishes the request's. If the answer verdict is confirmed while the claim verdict is
    still being retried, committing the request's offsets would lose the claim verdict to a
    crash: the later step waits for the earlier one."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0, outputs=1, finishes=False))  # the claim verdict
    await pub.submit(step(0, outputs=1))  # the answer verdict: finishes offset 0
    producer.confirmations[0].set_exception(KafkaTimeoutError())
    producer.confirm(1)  # the answer verdict is through
    await settled()
    assert producer.sent == [b"0.0", b"0.0", b"0.0"]  # the claim verdict sent again
    assert tracker.pending_count() == 1  # offset 0 is not finished: nothing to commit
    assert tracker.committable() in ({}, {TP: 0})
    producer.confirm(2)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0 and tracker.low_water(TP) == 1


async def test_a_step_that_gives_up_leaves_the_later_steps_inputs_pending() -> None:
    """Stopping while the earlier step retries: it gives up, and so does the later one."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(2))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0, outputs=1, finishes=False))
    await pub.submit(step(1, outputs=1))
    pub._stopping.set()
    producer.confirmations[0].set_exception(KafkaTimeoutError())
    producer.confirm(1)
    await settled()
    producer.confirmations[2].set_exception(KafkaTimeoutError())  # its last try fails too
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 2  # both re-read after the restart


async def test_outputs_that_could_not_be_handed_over_go_out_in_order_before_later_steps() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(2))
    producer.refuse_send.add(b"0.0")  # the producer's buffer is full for the first output
    pub = publisher(producer, tracker, pipelined=True)
    first = asyncio.create_task(pub.submit(step(0)))
    await settled()
    assert producer.sent == [b"0.0"]  # retried first; 0.1 waits behind it, not before it
    assert not first.done()  # and no later step is handed over meanwhile
    producer.confirm(0)
    await settled()
    assert producer.sent == [b"0.0", b"0.1"]
    producer.confirm(1)
    await asyncio.wait_for(first, timeout=1.0)
    await pub.submit(step(1))
    assert producer.sent == [b"0.0", b"0.1", b"1.0", b"1.1"]


async def test_an_out_of_order_refusal_replaces_the_producer_once_and_is_retried() -> None:
    """aiokafka's idempotent producer does not recover from OutOfOrderSequenceNumber: every
    later record to that partition is refused the same way (it used to stop the loop)."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0))
    producer.confirmations[0].set_exception(OutOfOrderSequenceNumber())
    producer.confirmations[1].set_exception(OutOfOrderSequenceNumber())
    await settled()
    assert producer.resets == 1  # both came from the same producer: one reset
    assert producer.sent[2:] == [b"0.0"]  # retried through the new one, in order
    producer.confirm(2)
    await settled()
    producer.confirm(3)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0
    assert pub.state.live and pub.state.producer_resets == 1


async def test_a_producer_that_cannot_be_replaced_is_replaced_on_the_next_failure() -> None:
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    producer.failing_resets = 1
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0, outputs=1))
    producer.confirmations[0].set_exception(OutOfOrderSequenceNumber())
    await settled()
    assert producer.resets == 0 and pub.state.producer_resets == 0  # the old one stays
    producer.confirmations[1].set_exception(OutOfOrderSequenceNumber())
    for _ in range(40):  # the retry waits its backoff (at most 0.1 s) first
        if len(producer.confirmations) > 2:
            break
        await asyncio.sleep(0.01)
    assert producer.resets == 1 and pub.state.producer_resets == 1
    producer.confirm(2)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0


async def test_a_broker_size_refusal_resets_the_producer_and_reads_the_limits_again() -> None:
    """The topic's limit was lowered after start: the broker refuses a record that passed the
    limit read at start. The producer is replaced, the limits read again, and the record
    goes to the DLQ without another refusal."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    pub = publisher(producer, tracker, pipelined=True)
    producer.own_limits = {"out.verdicts": 2}  # what describe_configs says now
    await pub.submit(step(0, outputs=1))
    producer.confirmations[0].set_exception(MessageSizeTooLargeError())
    await settled()
    assert producer.resets == 1 and pub.limits[Destination.VERDICTS] == 2
    assert producer.reset_batches == [2]  # the new producer's batches within it
    assert producer.topics == ["out.verdicts", "out.dlq"]  # dead-lettered, not sent again
    producer.confirm(1)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0 and pub.state.undeliverable_outputs == 1


async def test_a_limit_raised_after_the_next_read_still_counts_without_another_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An output over its topic's limit has the limits read again on a later tick. Read
    once, a limit the operator raised after that read went unseen until another output was
    over it, and dead-lettered for it (the real-broker test failed when its tick read the
    limits before the operator's change landed)."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    producer.own_limits = {"out.verdicts": 2}
    pub = publisher(producer, tracker, pipelined=True)
    caplog.set_level(logging.INFO, logger="sidecar")
    await pub.read_topic_limits()
    pub.limits_refresh_s = 0.0
    await pub.submit(step(0, outputs=1))  # over 2 bytes: dead-lettered
    assert producer.topics == ["out.dlq"]
    assert await pub.refresh_limits()  # read again: still 2
    assert await pub.refresh_limits()  # and again, while none was raised
    producer.own_limits = {"out.verdicts": 1_000}  # the operator raises it
    assert await pub.refresh_limits() and pub.limits[Destination.VERDICTS] == 1_000
    assert producer.resets == 1  # batches were capped at the old limit
    assert not await pub.refresh_limits()  # raised: no more reads until the next refusal
    said = [r.getMessage() for r in caplog.records if "record limits" in r.getMessage()]
    assert len(said) == 2 and "verdicts=1000," in said[1]  # when they changed, not per read


async def test_an_output_over_the_sidecars_own_limit_reads_no_topic_limits_again() -> None:
    """The topic allows more than the sidecar's own request limit: an output over the
    latter cannot be let through by raising the topic's, and the limits were read again
    every 30 s for as long as the pod lived."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(1))
    producer.own_limits = {"out.verdicts": 5_000_000}  # above the sidecar's 1 MB
    pub = publisher(producer, tracker, pipelined=True)
    await pub.read_topic_limits()
    pub.limits_refresh_s = 0.0
    pub.limits[Destination.VERDICTS] = pub._configured[Destination.VERDICTS] = 2  # its own
    await pub.submit(step(0, outputs=1))  # over 2 bytes: dead-lettered
    assert producer.topics == ["out.dlq"]
    assert not await pub.refresh_limits()


async def test_a_record_refused_with_its_batch_is_sent_again_not_dead_lettered() -> None:
    """The broker checks the limit per batch: a record refused with others may fit on its
    own. It is sent again as it is; refused twice more on its own, it is dead-lettered."""
    producer, tracker = HeldProducer(), consumed(OffsetTracker(), range(2))
    pub = publisher(producer, tracker, pipelined=True)
    await pub.submit(step(0, outputs=1))
    producer.confirmations[0].set_exception(MessageSizeTooLargeError())
    await settled()
    assert producer.topics == ["out.verdicts", "out.verdicts"]  # again, as it is
    producer.confirm(1)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.low_water(TP) == 1 and pub.state.undeliverable_outputs == 0
    await pub.submit(step(1, outputs=1))  # this one is too large on its own as well
    for k in (2, 3, 4):
        producer.confirmations[k].set_exception(MessageSizeTooLargeError())
        await settled()
    assert producer.topics[2:] == ["out.verdicts"] * 3 + ["out.dlq"]
    producer.confirm(5)
    assert await pub.settle(timeout_s=1.0)
    assert tracker.pending_count() == 0 and pub.state.undeliverable_outputs == 1


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


async def test_a_step_cancelled_as_the_step_before_it_is_cancelled_stays_cancelled() -> None:
    """A step waits for the step before it to finish its inputs; when that one is cancelled
    (a stop) the wait says "not finished". When the waiting step was itself cancelled in the
    same pass, that cancellation was taken for the other's and lost: the step returned
    False as if it had given up, and the stop that cancelled it did not see it end
    cancelled."""
    release = asyncio.Event()

    async def before() -> bool:
        await release.wait()
        return True

    earlier = asyncio.create_task(before())
    waiting = asyncio.create_task(Publisher._finished(earlier))
    await asyncio.sleep(0)  # the wait is on
    earlier.cancel()
    waiting.cancel()  # both, in one pass of the loop
    done, _ = await asyncio.wait({waiting}, timeout=5)
    assert done == {waiting}
    assert waiting.cancelled()
    alone = asyncio.create_task(before())
    still = asyncio.create_task(Publisher._finished(alone))
    await asyncio.sleep(0)
    alone.cancel()  # only the step before: "not finished", not a cancellation
    assert await still is False
