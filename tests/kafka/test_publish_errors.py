"""Publish errors decided by kind: retried with backoff, dead-lettered, or fatal (in memory).

The broker's errors are injected at the adapter's one seam to the producer
(``Publisher.send_output``); everything else is the real loop over
FastStream's in-memory broker.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotEnoughReplicasError,
    OutOfOrderSequenceNumber,
    RecordTooLargeError,
    RequestTimedOutError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict, DeadLetterRecord
from sidecar.exceptions import BrokerAccessError, BrokerError
from sidecar.exceptions import RecordTooLargeError as OutputTooLarge
from sidecar.kafka.publish import MAX_PUBLISH_BACKOFF_S, backoff_delay, classify
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Output, Step, rerouted_output
from sidecar.telemetry import Telemetry
from tests.conftest import EventFactory, dumps
from tests.core.test_telemetry import points
from tests.kafka.harness import MemoryHarness, memory_harness, settings_for, wait_until

Failure = Callable[[Output], BaseException | None]


@pytest.fixture
async def harness(unique_topics: dict[str, str]) -> AsyncIterator[MemoryHarness]:
    async with memory_harness(settings_for(unique_topics)) as h:
        yield h


def inject(h: MemoryHarness, failure: Failure) -> list[Output]:
    """Make ``send_output`` raise what ``failure`` returns for an output; returns the calls."""
    calls: list[Output] = []
    original = h.service.publisher.send_output

    async def send(out: Output) -> Any:
        calls.append(out)
        exc = failure(out)
        if exc is not None:
            raise exc
        return await original(out)

    h.service.publisher.send_output = send  # type: ignore[method-assign]
    return calls


async def request(
    h: MemoryHarness, rid: str, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    t = h.settings.topics
    await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode())
    await h.publish(t.generation, dumps(final_event(rid)), rid.encode())


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (KafkaConnectionError(), "retry"),
        (RequestTimedOutError(), "retry"),
        (NotEnoughReplicasError(), "retry"),
        (KafkaTimeoutError(), "retry"),
        (TimeoutError(), "retry"),
        (MessageSizeTooLargeError(), "dead-letter"),
        (RecordTooLargeError(), "dead-letter"),
        (TopicAuthorizationFailedError("rag.verdicts"), "fatal"),
        (OutOfOrderSequenceNumber(), "retry"),  # after a producer reset (Publisher)
    ],
)
def test_errors_are_classified_by_kind(exc: BaseException, kind: str) -> None:
    error = classify(exc, "rag.verdicts")
    assert isinstance(error, BrokerError)
    flags = {"retry": error.retriable, "dead-letter": error.dead_letter, "fatal": error.fatal}
    assert [name for name, on in flags.items() if on] == [kind]
    if kind == "fatal":
        assert isinstance(error, BrokerAccessError) and error.topic == "rag.verdicts"
    if kind == "dead-letter":
        assert isinstance(error, OutputTooLarge)


def test_backoff_is_capped_exponential_with_jitter() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(attempt, rng) for attempt in range(40)]
    ceilings = [min(MAX_PUBLISH_BACKOFF_S, 0.1 * 2**a) for a in range(40)]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= MAX_PUBLISH_BACKOFF_S
    capped = delays[10:]
    assert len({round(d, 6) for d in capped}) > len(capped) // 2  # jittered, not in step
    assert backoff_delay(10**6, rng) <= MAX_PUBLISH_BACKOFF_S  # no overflow


async def test_retriable_errors_are_retried_and_readiness_follows_a_stall(
    harness: MemoryHarness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    h = harness
    h.service.state.publish_stall_s = 0.2
    release = asyncio.Event()

    def failure(out: Output) -> BaseException | None:
        return None if release.is_set() else KafkaConnectionError("broker away")

    calls = inject(h, failure)
    assert h.service.state.publishing
    task = asyncio.create_task(request(h, "req-r", retrieval_event, final_event))
    await wait_until(lambda: not h.service.state.publishing, 10, "readiness to drop")
    assert h.service.state.live  # a broker that is away is not a reason to restart
    assert h.service.state.publish_retries >= 2
    assert h.received[h.settings.topics.verdicts] == []
    release.set()
    [msg] = await h.collect(h.settings.topics.verdicts, 1)
    await task
    assert AnswerVerdict.model_validate(orjson.loads(msg.value)).request_id == "req-r"
    # the consumer may see the verdict before the publisher has taken its confirmation
    await wait_until(
        lambda: h.service.state.publishing and h.service.tracker.pending_count() == 0,
        5,
        "readiness back and the inputs finished, once the verdict is confirmed",
    )
    assert len(calls) >= 3


async def test_a_verdict_its_topic_refuses_as_too_large_is_dead_lettered(
    harness: MemoryHarness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    h = harness
    t = h.settings.topics

    def failure(out: Output) -> BaseException | None:
        too_large: BaseException = MessageSizeTooLargeError()
        return too_large if out.destination is Destination.VERDICTS else None

    inject(h, failure)
    await request(h, "req-big", retrieval_event, final_event)
    [dead] = await h.collect(t.dlq, 1)
    record = DeadLetterRecord.from_headers(dead.headers)
    assert record.reason == "output-too-large"
    assert record.source_topic == t.verdicts
    assert record.source_offset == -1
    assert dead.key == b"req-big"
    assert AnswerVerdict.model_validate(orjson.loads(dead.value)).request_id == "req-big"
    assert h.received[t.verdicts] == []
    assert h.service.state.undeliverable_outputs == 1
    await wait_until(lambda: h.service.tracker.pending_count() == 0, 5, "inputs finished")
    assert h.service.state.publishing and h.service.state.live


async def test_a_verdict_replaced_by_its_dead_letter_is_counted_as_a_dead_letter_only(
    unique_topics: dict[str, str], retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """``guardrail.verdicts`` counts what the broker confirmed: a verdict its topic refused
    went out as a dead letter, and was counted as a verdict too before."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter=MeterProvider(metric_readers=[reader]).get_meter("t"))
    async with memory_harness(settings_for(unique_topics), telemetry) as h:

        def failure(out: Output) -> BaseException | None:
            refused = out.destination is Destination.VERDICTS and out.key == b"req-big"
            return MessageSizeTooLargeError() if refused else None

        inject(h, failure)
        await request(h, "req-big", retrieval_event, final_event)
        await request(h, "req-ok", retrieval_event, final_event)
        await h.collect(h.settings.topics.verdicts, 1)
        await wait_until(lambda: h.service.tracker.pending_count() == 0, 5, "inputs finished")
    got = points(reader)
    assert sum(p.value for p in got["guardrail.verdicts"]) == 1
    assert [dict(p.attributes) for p in got["guardrail.dead_letters"]] == [
        {"reason": "output-too-large"}
    ]


async def test_an_output_over_its_known_limit_is_dead_lettered_without_a_send(
    harness: MemoryHarness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    h = harness
    t = h.settings.topics
    h.service.publisher.limits[Destination.VERDICTS] = 200  # smaller than any verdict
    calls = inject(h, lambda out: None)
    await request(h, "req-lim", retrieval_event, final_event)
    [dead] = await h.collect(t.dlq, 1)
    assert DeadLetterRecord.from_headers(dead.headers).reason == "output-too-large"
    assert [c.destination for c in calls] == [Destination.DLQ]


async def test_an_authorisation_error_is_fatal_logged_once_and_commits_nothing(
    harness: MemoryHarness,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = harness
    t = h.settings.topics

    def failure(out: Output) -> BaseException | None:
        refused: BaseException = TopicAuthorizationFailedError(t.verdicts)
        return refused

    inject(h, failure)
    caplog.set_level(logging.ERROR, logger="sidecar.kafka")
    task = asyncio.create_task(request(h, "req-acl", retrieval_event, final_event))
    await wait_until(lambda: not h.service.state.live, 10, "liveness to drop")
    await wait_until(lambda: h.service.state.publish_retries >= 3, 10, "more retries")
    assert not h.service.state.publishing
    assert h.service.state.fatal is not None and t.verdicts in h.service.state.fatal
    fatal_lines = [r for r in caplog.records if "FATAL" in r.getMessage()]
    assert len(fatal_lines) == 1
    assert t.verdicts in fatal_lines[0].getMessage()
    assert h.service.tracker.pending_count() == 2  # nothing finished, nothing to commit
    assert h.service.tracker.committable() in ({}, {(t.retrieval, 0): 0, (t.generation, 0): 0})
    task.cancel()


async def test_a_missing_output_topic_becomes_fatal_once_it_persists(
    harness: MemoryHarness,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """aiokafka retries an unknown topic itself; when it still reports one, it has persisted."""
    h = harness
    h.service.state.missing_topic_fatal_s = 0.3
    inject(h, lambda out: UnknownTopicOrPartitionError())
    task = asyncio.create_task(request(h, "req-ut", retrieval_event, final_event))
    await wait_until(lambda: h.service.state.publish_retries >= 1, 10, "a retry")
    assert h.service.state.live  # not at once: a topic may be created a moment late
    await wait_until(lambda: not h.service.state.live, 10, "liveness to drop")
    assert h.service.state.fatal is not None
    assert h.settings.topics.verdicts in h.service.state.fatal
    task.cancel()


async def test_an_output_waiting_for_its_confirmation_makes_the_loop_unready(
    harness: MemoryHarness, retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """aiokafka retries a record itself for its request timeout (30 s) before the loop
    hears of a failure: a deleted verdict topic left ``/readyz`` 200 for 70 s. Readiness
    follows the oldest output not yet confirmed, whatever the producer says meanwhile."""
    h = harness
    h.service.state.publish_stall_s = 0.3
    original = h.service.publisher.send_output
    release, handed_over = asyncio.Event(), asyncio.Event()

    async def send(out: Output) -> Any:
        confirmation = await original(out)
        handed_over.set()

        async def confirmed() -> Any:
            await release.wait()  # aiokafka still retrying inside the producer
            return await confirmation

        return asyncio.ensure_future(confirmed())

    h.service.publisher.send_output = send  # type: ignore[method-assign]
    task = asyncio.create_task(request(h, "req-slow", retrieval_event, final_event))
    await asyncio.wait_for(handed_over.wait(), 10)
    assert h.service.state.publishing  # not at once
    await wait_until(lambda: not h.service.state.publishing, 10, "readiness to drop")
    assert h.service.state.publish_retries == 0 and h.service.state.live
    release.set()
    await h.collect(h.settings.topics.verdicts, 1)
    await task
    await wait_until(lambda: h.service.state.publishing, 10, "readiness back")
    assert h.service.state.unconfirmed_since is None
    assert h.service.tracker.pending_count() == 0


async def test_a_rerouted_record_its_topic_refuses_us_is_dead_lettered_and_the_loop_lives(
    harness: MemoryHarness, final_event: EventFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A sidecar without WRITE on the input topics: a record off its request's partition
    (a producer's partitioner) costs that record, dead-lettered as itself, not liveness."""
    h = harness
    t = h.settings.topics
    off = InputRef(t.generation, 2, 17, (("traceparent", b"x"),), partitions=3)
    copy = rerouted_output(InputKind.GENERATION, dumps(final_event("req-rr")), "req-rr", off)

    def failure(out: Output) -> BaseException | None:
        refused: BaseException = TopicAuthorizationFailedError(t.generation)
        return refused if out.destination is Destination.GENERATION else None

    calls = inject(h, failure)
    caplog.set_level(logging.ERROR, logger="sidecar.kafka")
    await h.service.publisher.emit(Step(outputs=[copy]))
    [dead] = await h.collect(t.dlq, 1)
    record = DeadLetterRecord.from_headers(dead.headers)
    assert (record.reason, record.source_topic, record.source_partition, record.source_offset) == (
        "reroute-refused",
        t.generation,
        2,
        17,
    )
    assert "WRITE" in record.detail and "GUARDRAIL_JOIN__REROUTE" in record.detail
    assert [c.destination for c in calls] == [Destination.GENERATION, Destination.DLQ]
    assert h.service.state.live and h.service.state.fatal is None
    assert h.service.state.undeliverable_outputs == 1
    assert any("rerouting a record" in r.getMessage() for r in caplog.records)


async def test_a_rerouted_record_over_its_topics_limit_is_dead_lettered_as_itself(
    harness: MemoryHarness, final_event: EventFactory
) -> None:
    """The copy is the original plus a key and a header: one that no longer fits its topic
    is the original's dead letter (its partition and offset), not an output's."""
    h = harness
    t = h.settings.topics
    off = InputRef(t.generation, 1, 9, partitions=3)
    copy = rerouted_output(InputKind.GENERATION, dumps(final_event("req-big")), "req-big", off)
    h.service.publisher.limits[Destination.GENERATION] = len(copy.value)  # fits no header
    calls = inject(h, lambda out: None)
    await h.service.publisher.emit(Step(outputs=[copy]))
    [dead] = await h.collect(t.dlq, 1)
    record = DeadLetterRecord.from_headers(dead.headers)
    assert (record.reason, record.source_partition, record.source_offset) == (
        "reroute-refused",
        1,
        9,
    )
    assert [c.destination for c in calls] == [Destination.DLQ]  # never sent as it was
    assert dead.value == copy.value
