"""Re-deciding old traffic keeps its labels (real broker).

A team resets the group (or starts a second one) to re-decide a day of traffic after a
policy change: the day's labels are already in ``rag.feedback``. The feedback partition,
small records, was read far ahead of the inputs it labels; a label read before any event
of its request waits in a bounded pool (10,000) for it, and the pool gave up its oldest
labels for room: exactly those of the requests decided next (audit: a backlog of 13,000
labelled requests over 3 partitions, 1,293 labels unmatched, never in the coverage bound
or a certificate's re-test). The feedback partition now waits, as the two inputs wait for
each other, while its labels' timestamps lead the inputs' and the inputs have a backlog.
Here the pool is shrunk to 300 so that a small backlog shows it.
"""

from __future__ import annotations

import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from sidecar.confidence.fleet import CoverageMonitor
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.pipeline.ports import SignalSuite
from tests.conftest import EventFactory, dumps
from tests.fakes import ThresholdCertifier
from tests.kafka.harness import real_harness, settings_for, wait_until

pytestmark = pytest.mark.connected

REQUESTS = 1_500
POOL = 300  # labels waiting for their request (10,000 in service)


async def test_a_backlog_of_labelled_requests_is_re_decided_with_every_label(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        topics={"partitions": 1},
        # ~130 labels a fetch; the labels wait while the inputs have a poll (100) left
        kafka={"max_partition_fetch_bytes": 16_384, "max_poll_records": 100},
    )
    await create_topics(settings)
    t = settings.topics
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    await producer.start()
    day_ago = int(time.time() * 1000) - 86_400_000
    try:
        sent = []
        for i in range(REQUESTS):  # yesterday's traffic, each label a minute after its answer
            rid, at = f"req-{i}", day_ago + 1_000 * i
            label = {"schema_version": 1, "event_type": "feedback", "request_id": rid,
                     "correct": i % 4 != 0, "source": "grader"}  # fmt: skip
            for topic, value, stamp in (
                (t.retrieval, dumps(retrieval_event(rid)), at),
                (t.generation, dumps(final_event(rid)), at + 10),
                (t.feedback, orjson.dumps(label), at + 60_000),
            ):
                sent.append(await producer.send(topic, value, rid.encode(), timestamp_ms=stamp))
        for future in sent:
            await future
    finally:
        await producer.stop()
    monitor = CoverageMonitor()
    suite = SignalSuite(certifier=ThresholdCertifier(calibration_key="acme/wiki"), coverage=monitor)
    async with real_harness(settings, signals=suite) as h:
        processor = h.service.processor
        processor.waiting_labels.max_entries = POOL
        assert len(await h.collect(t.verdicts, REQUESTS, timeout_s=120)) == REQUESTS
        await wait_until(
            lambda: processor.counters.feedback == REQUESTS, 60, "every label consumed"
        )
        await wait_until(lambda: len(processor.waiting_labels) == 0, 10, "no label waiting")
        unmatched = processor.counters.feedback_unmatched
    counts = monitor.tracker.counts("acme/wiki")
    assert unmatched == 0
    assert counts.labelled_covered + counts.labelled_uncovered == REQUESTS
