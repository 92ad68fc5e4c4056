"""Hostile records against a real broker: the adapter never loses a batch, the DLQ never wedges.

* a header value that is not UTF-8, or null, costs no request, in batch and in single mode;
* a dead letter too large for the DLQ topic is published truncated (first bytes of
  the value, original size and hash in headers) and the loop moves on;
* a forged ``reply_to`` header makes the sidecar write nowhere (FastStream would answer it);
* header bytes travel untouched: a header of 0xff bytes is not re-encoded (which
  would triple it) on its way to the DLQ.

The topics are created with a small ``max.message.bytes`` so the records stay small.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sidecar.config import Settings
from sidecar.contracts.events import AnswerVerdict, Decision
from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import (
    Msg,
    RealHarness,
    committed,
    read_settled,
    real_harness,
    settings_for,
    wait_until,
)

pytestmark = pytest.mark.connected

TOPIC_LIMIT = 65_536  # max.message.bytes of the input and DLQ topics in these tests
NOT_UTF8 = b"\xff\xfe\x00\xc3("  # invalid start bytes, a NUL, a truncated sequence
BROKEN = b'{"schema_version": 1, "event_type": "generation.final", "request_id": "req-x", "ans'


async def produce(settings: Settings, records: list[tuple[str, bytes, bytes, list[Any]]]) -> None:
    """(topic, key, value, headers) with raw header bytes, all acknowledged before returning."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        acks="all",
        max_request_size=2 * TOPIC_LIMIT,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=key, headers=headers)
            for topic, key, value, headers in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def requests(
    settings: Settings, ids: list[str], retrieval_event: EventFactory, final_event: EventFactory
) -> list[tuple[str, bytes, bytes, list[Any]]]:
    t = settings.topics
    out: list[tuple[str, bytes, bytes, list[Any]]] = []
    for rid in ids:
        out.append((t.retrieval, rid.encode(), dumps(retrieval_event(rid)), []))
        out.append((t.generation, rid.encode(), dumps(final_event(rid)), []))
    return out


def answered(msgs: list[Msg]) -> dict[str, AnswerVerdict]:
    verdicts = (AnswerVerdict.model_validate(orjson.loads(m.value)) for m in msgs)
    return {v.request_id: v for v in verdicts}


async def all_committed(h: RealHarness, settings: Settings, total: int) -> dict[Any, int]:
    """Wait until every input is finished and committed; return the group's committed offsets."""
    await wait_until(lambda: h.service.tracker.pending_count() == 0, 20, "inputs finished")
    await wait_until(
        lambda: h.service.state.commits > 0 and not h.service.tracker.committable(), 20, "commit"
    )
    offsets = await committed(settings.kafka.bootstrap_servers, settings.kafka.group_id)
    assert sum(offsets.values()) == total, offsets
    return offsets


@pytest.mark.parametrize(
    "headers",
    [[("x-binary", NOT_UTF8)], [("x-null", None), ("traceparent", None)]],
    ids=["not-utf8", "null"],  # null: FastStream's parser died on None, losing the whole poll
)
@pytest.mark.parametrize("batch", [True, False], ids=["batch", "single"])
async def test_a_non_utf8_or_null_header_value_costs_no_request(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    batch: bool,
    headers: list[tuple[str, bytes | None]],
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers, kafka={"batch": batch})
    await create_topics(settings)
    t = settings.topics
    ids = [f"req-h{i:02d}" for i in range(20)]
    records = requests(settings, ids, retrieval_event, final_event)
    topic, key, value, _ = records[15]  # a valid final event with a binary or null header
    records[15] = (topic, key, value, headers)
    broken_headers = [("x-binary", NOT_UTF8), ("traceparent", b"00-abc")]
    records.append((t.generation, b"req-x", BROKEN, broken_headers))
    await produce(settings, records)  # all of it waits before the sidecar starts: one batch

    async with real_harness(settings) as h:
        verdicts = answered(await h.collect(t.verdicts, len(ids)))
        assert sorted(verdicts) == ids
        for verdict in verdicts.values():
            assert verdict.decision is Decision.CAVEAT, verdict
            assert "incomplete" not in {r.code for r in verdict.reasons}
        [dead] = await h.collect(t.dlq, 1)
        assert dead.value == BROKEN
        assert dead.headers["x-dlq-reason"] == b"malformed-json"
        assert dead.headers["x-binary"] == NOT_UTF8  # byte for byte
        assert dead.headers["traceparent"] == b"00-abc"
        await all_committed(h, settings, len(records))


@pytest.mark.parametrize("batch", [True, False], ids=["batch", "single"])
async def test_a_forged_reply_to_header_makes_the_sidecar_write_nowhere_else(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    batch: bool,
) -> None:
    """FastStream answers a record that names ``reply_to`` by publishing the handler's result
    there; the sidecar must not: its own input topics stay as the producer left them."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers, kafka={"batch": batch})
    await create_topics(settings)
    t = settings.topics
    ids = [f"req-r{i}" for i in range(4)]
    forged = [("reply_to", t.retrieval.encode()), ("correlation_id", b"c1")]
    records = [
        (topic, key, value, [forged[i % 2]] if i % 3 else forged)
        for i, (topic, key, value, _) in enumerate(
            requests(settings, ids, retrieval_event, final_event)
        )
    ]
    records.append((t.generation, b"req-x", BROKEN, [("reply_to", t.feedback.encode())]))
    await produce(settings, records)

    async with real_harness(settings) as h:
        assert sorted(answered(await h.collect(t.verdicts, len(ids)))) == ids
        [dead] = await h.collect(t.dlq, 1)
        assert dead.headers["x-dlq-reason"] == b"malformed-json"
        await all_committed(h, settings, len(records))
    bootstrap = settings.kafka.bootstrap_servers
    retrieval = await read_settled(bootstrap, t.retrieval, 1.0)
    assert sorted(r.key for r in retrieval) == [i.encode() for i in ids]  # nothing added
    assert await read_settled(bootstrap, t.feedback, 0.5) == []
    assert len(await read_settled(bootstrap, t.dlq, 0.5)) == 1


async def test_a_dead_letter_too_large_for_the_dlq_is_truncated_and_the_loop_moves_on(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        topics={"max_message_bytes": TOPIC_LIMIT},
    )
    await create_topics(settings)
    t = settings.topics
    # accepted by the input topic; its DLQ copy (+ x-dlq-* headers) is not
    oversize = b'{"request_id": "req-big", "pad": "' + b"x" * (TOPIC_LIMIT - 250)
    first = [(t.generation, b"req-big", oversize, [("traceparent", b"00-big")])]
    later = requests(settings, ["req-l0", "req-l1", "req-l2"], retrieval_event, final_event)
    await produce(settings, first + later)

    async with real_harness(settings) as h:
        [dead] = await h.collect(t.dlq, 1)
        assert dead.headers["x-dlq-truncated"] == b"true"
        assert dead.headers["x-dlq-original-size"] == str(len(oversize)).encode()
        assert (
            dead.headers["x-dlq-original-sha256"] == hashlib.sha256(oversize).hexdigest().encode()
        )
        assert dead.headers["x-dlq-reason"] == b"malformed-json"
        assert dead.headers["traceparent"] == b"00-big"
        assert dead.key == b"req-big"
        assert 0 < len(dead.value) < len(oversize)
        assert oversize.startswith(dead.value)
        # later requests are answered promptly, the offsets move past the oversize record
        assert sorted(answered(await h.collect(t.verdicts, 3, timeout_s=15))) == [
            "req-l0",
            "req-l1",
            "req-l2",
        ]
        await all_committed(h, settings, 1 + len(later))

    # a restart neither wedges nor dead-letters the record again
    again = requests(settings, ["req-r0"], retrieval_event, final_event)
    async with real_harness(settings) as h:
        await produce(settings, again)
        assert "req-r0" in answered(await h.collect(t.verdicts, 4, timeout_s=15))
        assert len(await h.collect(t.dlq, 2, timeout_s=1.0)) == 1
        await all_committed(h, settings, 1 + len(later) + len(again))


@pytest.mark.parametrize("header_bytes", [30_000, 65_000], ids=["kept", "trimmed"])
async def test_a_header_of_0xff_bytes_travels_untouched(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
    header_bytes: int,
) -> None:
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        topics={"max_message_bytes": TOPIC_LIMIT},
    )
    await create_topics(settings)
    t = settings.topics
    blob = b"\xff" * header_bytes  # decoded with errors="replace", re-encoded: 3x the size
    headers = [("traceparent", b"00-ff"), ("x-blob", blob)]
    later = requests(settings, ["req-f0", "req-f1"], retrieval_event, final_event)
    await produce(settings, [(t.generation, b"req-x", BROKEN, headers), *later])

    async with real_harness(settings) as h:
        [dead] = await h.collect(t.dlq, 1)
        assert dead.value == BROKEN
        assert dead.key == b"req-x"
        assert dead.headers["traceparent"] == b"00-ff"
        assert dead.headers["x-dlq-reason"] == b"malformed-json"
        if header_bytes == 30_000:  # fits as bytes (not re-encoded): kept byte for byte
            assert dead.headers["x-blob"] == blob
            assert "x-dlq-truncated" not in dead.headers
        else:  # with the x-dlq-* headers it cannot fit: the blob is dropped, and named
            assert "x-blob" not in dead.headers
            assert dead.headers["x-dlq-truncated"] == b"true"
            assert dead.headers["x-dlq-dropped-headers"] == b"x-blob"
        assert sorted(answered(await h.collect(t.verdicts, 2, timeout_s=15))) == [
            "req-f0",
            "req-f1",
        ]
        await all_committed(h, settings, 1 + len(later))


async def test_a_dlq_topic_smaller_than_configured_still_takes_a_truncated_dead_letter(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """The topic's own max.message.bytes, not the setting, decides: read at start, obeyed.

    (A dead letter the broker refuses would break the idempotent producer for good:
    the next batch gets OutOfOrderSequenceNumber. So the limit must be known first.)
    """
    settings = settings_for(
        unique_topics,
        kafka_broker.bootstrap_servers,
        topics={"max_message_bytes": TOPIC_LIMIT},
    )
    t = settings.topics
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:  # someone made the DLQ topic with a quarter of the configured limit
        dlq = NewTopic(t.dlq, 1, 1, topic_configs={"max.message.bytes": str(TOPIC_LIMIT // 4)})
        await admin.create_topics([dlq])
    finally:
        await admin.close()
    await create_topics(settings)
    big = b'{"request_id": "req-x", "pad": "' + b"y" * (TOPIC_LIMIT // 2)
    later = requests(settings, ["req-s0", "req-s1"], retrieval_event, final_event)
    await produce(settings, [(t.generation, b"req-x", big, []), *later])

    async with real_harness(settings) as h:
        [dead] = await h.collect(t.dlq, 1, timeout_s=30)
        assert dead.headers["x-dlq-truncated"] == b"true"
        assert dead.headers["x-dlq-original-size"] == str(len(big)).encode()
        assert big.startswith(dead.value)
        # the limit read from the topic at start, not the configured one
        assert f"{TOPIC_LIMIT // 4}-byte limit".encode() in dead.headers["x-dlq-truncated-reason"]
        assert sorted(answered(await h.collect(t.verdicts, 2, timeout_s=30))) == [
            "req-s0",
            "req-s1",
        ]
        await all_committed(h, settings, 1 + len(later))


async def test_a_killed_sidecar_process_re_reads_the_hostile_records_and_does_not_wedge(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    """As reported: a real sidecar process, killed before it commits, restarted."""
    bootstrap = kafka_broker.bootstrap_servers
    settings = settings_for(unique_topics, bootstrap, topics={"max_message_bytes": TOPIC_LIMIT})
    await create_topics(settings)
    t = settings.topics
    env = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "GUARDRAIL_KAFKA__GROUP_ID": unique_topics["group"],
        "GUARDRAIL_TOPICS__MAX_MESSAGE_BYTES": str(TOPIC_LIMIT),
        **{f"GUARDRAIL_TOPICS__{k.upper()}": v for k, v in unique_topics.items() if k != "group"},
    }
    oversize = b'{"request_id": "req-big", "pad": "' + b"x" * (TOPIC_LIMIT - 250)
    records = [(t.generation, b"req-big", oversize, [("x-binary", NOT_UTF8)])]
    records += requests(settings, ["req-p0", "req-p1"], retrieval_event, final_event)
    topic, key, value, _ = records[-1]
    records[-1] = (topic, key, value, [("x-binary", NOT_UTF8)])

    # 1st life: answers and dead-letters, never commits (its commit sweep is an hour away)
    never_commits = SidecarProcess(
        {**env, "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "3600000"}, tmp_path / "1.log"
    )
    never_commits.start()
    await produce(settings, records)
    for _ in range(100):
        if len(await read_settled(bootstrap, t.verdicts, 0.3)) >= 2 and await read_settled(
            bootstrap, t.dlq, 0.3
        ):
            break
    assert never_commits.signal(signal.SIGKILL) == -signal.SIGKILL
    assert await committed(bootstrap, unique_topics["group"]) == {}

    # 2nd life: re-reads all of it, cuts the dead letter again, answers a new request
    second = SidecarProcess(env, tmp_path / "2.log")
    second.start()
    await produce(settings, requests(settings, ["req-p2"], retrieval_event, final_event))
    for _ in range(100):
        got = {
            orjson.loads(r.value)["request_id"]
            for r in await read_settled(bootstrap, t.verdicts, 0.3)
        }
        if got >= {"req-p0", "req-p1", "req-p2"}:
            break
    assert second.signal(signal.SIGTERM) == 0
    assert got == {"req-p0", "req-p1", "req-p2"}, second.tail()
    dead = await read_settled(bootstrap, t.dlq)
    assert len(dead) == 2  # once per life, the same truncated dead letter
    for record in dead:
        headers = dict(record.headers)
        assert headers["x-dlq-truncated"] == b"true"
        assert headers["x-binary"] == NOT_UTF8
        assert headers["x-dlq-original-sha256"] == hashlib.sha256(oversize).hexdigest().encode()
    done = await committed(bootstrap, unique_topics["group"])
    assert sum(done.values()) == len(records) + 2
