"""``guardrail dlq inspect|redrive`` on the real broker, against dead letters the sidecar wrote.

A sidecar with tight limits dead-letters three requests whose retrieval has too many
hits and whose final is too long (both halves: each request is decided ``incomplete``
naming the dead letter), two records that are not JSON and one that breaks its
schema. ``inspect`` counts them; ``redrive`` refuses the reasons whose bytes would be
refused again, counts without sending by default, and once a sidecar with the limits
raised runs, sends the six dead letters back with their original key and headers:
each request is decided on its own inputs, and nothing new is dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

from sidecar.dlq.letters import NO_REASON, Tally, read_dead_letter
from sidecar.kafka.dlq import DlqScan, Redriver
from sidecar.kafka.topics import create_topics
from sidecar.lab.localkafka.broker import LocalKafka
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import (
    cli,
    end_offsets,
    incomplete_count,
    read_settled,
    real_harness,
    settings_for,
)

pytestmark = pytest.mark.connected

REPO = Path(__file__).resolve().parents[2]

REQUESTS = [f"big-{i}" for i in range(3)]


async def test_inspect_counts_and_a_redrive_after_the_limits_are_raised_decides_the_requests(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    tight = settings_for(unique_topics, bootstrap, limits={"max_hits": 1, "max_answer_chars": 20})
    t = tight.topics
    for role in ("retrieval", "generation", "feedback", "dlq"):  # what the CLI reads
        monkeypatch.setenv(f"GUARDRAIL_TOPICS__{role.upper()}", unique_topics[role])
    async with real_harness(tight) as h:
        for i, rid in enumerate(REQUESTS):
            headers = {"x-app": f"app-{i}", "X-DLQ-Reason": "the producer's own"}
            await h.publish(t.retrieval, dumps(retrieval_event(rid)), rid.encode(), headers)
            long_final = final_event(rid, answer="Mary Shelley wrote it. " * 3)
            await h.publish(t.generation, dumps(long_final), rid.encode(), headers)
        for i in range(2):
            await h.publish(t.retrieval, b'{"schema_version": 1, ', f"junk-{i}".encode())
        bad = retrieval_event("bad-0", k="two")
        await h.publish(t.retrieval, dumps(bad), b"bad-0")
        letters = await h.collect(t.dlq, 9, timeout_s=60)
        assert len(letters) == 9, [m.headers.get("x-dlq-reason") for m in letters]
        first = await h.collect(t.verdicts, 3, timeout_s=30)
        assert incomplete_count([json.loads(v.value) for v in first]) == 3
    # what a dead letter carries: the original key and headers (the producer's own x-dlq-*
    # header is not carried: it would read as the sidecar's)
    hits = [m for m in letters if m.headers["x-dlq-reason"] == b"too-many-hits"]
    assert sorted(m.key or b"" for m in hits) == [r.encode() for r in REQUESTS]
    assert {m.headers["x-app"] for m in hits} == {b"app-0", b"app-1", b"app-2"}

    code, out, err = await cli(tight, "dlq", "inspect", "--json", "--no-progress")
    assert code == 0, err
    seen = json.loads(out)
    assert seen["total"] == 9
    assert seen["by_reason"] == {
        "too-many-hits": 3,
        "answer-too-long": 3,
        "malformed-json": 2,
        "schema-violation": 1,
    }
    assert seen["by_source_topic"] == {t.retrieval: 6, t.generation: 3}
    assert set(seen["samples"]["too-many-hits"]["request_ids"]) == set(REQUESTS)
    assert seen["samples"]["schema-violation"]["request_ids"] == ["bad-0"]
    assert seen["first"] is not None
    assert seen["first"] <= seen["last"]
    code, out, _ = await cli(tight, "dlq", "inspect", "--reason", "malformed-json", "--json")
    assert (code, json.loads(out)["total"]) == (0, 2)
    code, out, _ = await cli(tight, "dlq", "inspect", "--limit", "4", "--json")
    assert json.loads(out)["total"] == 4
    assert json.loads(out)["stopped_at_limit"] is True
    later = datetime.now(UTC).isoformat()  # after every dead letter: none to read
    code, out, _ = await cli(tight, "dlq", "inspect", "--since", later, "--json")
    assert (code, json.loads(out)["total"], json.loads(out)["first"]) == (0, 0, None)
    code, out, _ = await cli(tight, "dlq", "inspect", "--since", "1h")
    assert code == 0
    assert "9 dead letter(s)" in out
    assert "too-many-hits" in out

    # bytes that would be refused again: refused, nothing read or sent
    code, _, err = await cli(tight, "dlq", "redrive", "--reason", "malformed-json", "--yes")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "malformed-json" in err
    assert "--force" in err

    inputs_before = await end_offsets(bootstrap, [t.retrieval, t.generation], 3)
    redrive = ["dlq", "redrive", "--reason", "too-many-hits", "--reason", "answer-too-long"]
    code, out, _ = await cli(tight, *redrive, "--json")  # a dry run by default
    dry = json.loads(out)
    assert (code, dry["dry_run"], dry["selected"], dry["sent"]) == (0, True, 6, 0)
    assert dry["not_selected"] == 3
    assert dry["one_sided_requests"] == 0
    assert await end_offsets(bootstrap, [t.retrieval, t.generation], 3) == inputs_before

    # the limits raised (a new sidecar, the same group): the dead letters sent back
    loose = settings_for(unique_topics, bootstrap)
    async with real_harness(loose) as h2:
        code, out, _ = await cli(loose, *redrive, "--yes", "--json")
        sent = json.loads(out)
        assert (code, sent["dry_run"], sent["sent"], sent["skipped"]) == (0, False, 6, {})
        got = await h2.collect(t.verdicts, 6, timeout_s=60)
        verdicts = [json.loads(v.value) for v in got]
        second = [v for v in verdicts if incomplete_count([v]) == 0]
        assert sorted(v["request_id"] for v in second) == REQUESTS, verdicts
    # nothing new in the DLQ: the redrive never writes there, and the sidecar took them
    dlq = await read_settled(bootstrap, t.dlq, settle_s=1.0)
    assert len(dlq) == 9
    # the records sent back: the original bytes, key and headers, no x-dlq-* header
    for topic in (t.retrieval, t.generation):
        records = await read_settled(bootstrap, topic, settle_s=0.5)
        for i, rid in enumerate(REQUESTS):
            original, again = sorted((r for r in records if r.key == rid.encode()), key=offset)
            assert again.value == original.value
            assert list(again.headers) == [("x-app", f"app-{i}".encode())]


def offset(record: Any) -> int:
    return int(record.offset)


async def test_a_transactional_dlq_is_read_to_its_end_without_aborted_letters(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """Written in transactions, the DLQ ends in a commit marker (an offset no record has)
    and may hold aborted dead letters, which the retry wrote again: the scan stops at the
    marker, at once, and counts the committed letters only."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka.bootstrap_servers,
        transactional_id=f"txn-{unique_topics['group']}",
        enable_idempotence=True,
    )
    await producer.start()
    try:
        for reason, commit in (("oversize", False), ("oversize", True), ("too-deep", True)):
            await producer.begin_transaction()
            headers = [("x-dlq-reason", reason.encode())]
            await producer.send_and_wait(settings.topics.dlq, b"{}", key=b"r1", headers=headers)
            if commit:
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()
    tally = Tally()
    started = time.monotonic()
    async with DlqScan(settings) as scan:
        assert scan.to_read == 6  # three letters and three markers: offsets 0 to 5
        async for letter in scan.letters():
            tally.add(letter)
    assert time.monotonic() - started < 10  # not the stall guard's 30 s
    assert dict(tally.by_reason) == {"oversize": 1, "too-deep": 1}


async def test_a_dead_letter_whose_header_name_is_not_utf8_is_read_not_fatal(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], tmp_path: Path
) -> None:
    """A record on the DLQ with a header name that is not UTF-8 (a Go or C client writing
    to the topic, as the sidecar's inputs are guarded against): the CLI's consumer read
    names strictly, so every fetch raised UnicodeDecodeError and `guardrail dlq inspect`
    (and `redrive`) ended in a traceback, never reading past it. Run as a user runs it: a
    process of its own, in which nothing else made aiokafka's reader lenient."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        headers = [("x-dlq-reason", b"oversize"), ("x-dlq-source-topic", b"rag.retrieval")]
        await producer.send_and_wait(settings.topics.dlq, b"{}", key=b"r1", headers=headers)
    finally:
        await producer.stop()
    body = tmp_path / "value"
    body.write_bytes(b"{}")
    subprocess.run(
        [sys.executable, "-m", "tests.kafka.bad_header_name", settings.kafka.bootstrap_servers,
         settings.topics.dlq, "r2", str(body)],
        check=True, cwd=REPO, env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"}, timeout=60,
    )  # fmt: skip
    env = {**os.environ, "GUARDRAIL_TOPICS__DLQ": settings.topics.dlq}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "sidecar", "dlq", "inspect", "--json", "--no-progress",
         "--bootstrap-servers", settings.kafka.bootstrap_servers],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout)
    assert seen["total"] == 2
    assert seen["by_reason"] == {"oversize": 1, NO_REASON: 1}


async def test_a_redrive_skips_letters_of_a_source_topic_that_is_gone(
    kafka_broker: LocalKafka, unique_topics: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead letter of an input topic deleted since (or not made yet): the first send to it
    waited GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS for metadata, then stopped the whole redrive,
    the letters behind it of topics that exist never sent (on a broker that auto-creates
    topics, the send would have made the input topic again with the broker's defaults).
    It is skipped and counted instead, in the dry run too, and nothing asks for the topic."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    await create_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_topics([t.retrieval])
        for _ in range(100):  # until the metadata no longer has it
            if t.retrieval not in await admin.list_topics():
                break
            await asyncio.sleep(0.1)
    finally:
        await admin.close()
    for role in ("retrieval", "generation", "feedback", "dlq"):
        monkeypatch.setenv(f"GUARDRAIL_TOPICS__{role.upper()}", unique_topics[role])
    monkeypatch.setenv("GUARDRAIL_KAFKA__REQUEST_TIMEOUT_MS", "5000")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for rid, topic in (("r1", t.retrieval), ("r2", t.generation)):
            headers = [("x-dlq-reason", b"oversize"), ("x-dlq-source-topic", topic.encode())]
            await producer.send_and_wait(t.dlq, b"{}", key=rid.encode(), headers=headers)
    finally:
        await producer.stop()
    redrive = ["dlq", "redrive", "--reason", "oversize", "--json", "--no-progress"]
    code, out, err = await cli(settings, *redrive)
    dry = json.loads(out)
    assert (code, dry["selected"], dry["skipped"]) == (0, 1, {"source-topic-missing": 1}), err
    code, out, err = await cli(settings, *redrive, "--yes")
    sent = json.loads(out)
    assert (code, sent["sent"], sent["skipped"]) == (0, 1, {"source-topic-missing": 1}), err
    assert [r.key for r in await read_settled(settings.kafka.bootstrap_servers, t.generation)] == [
        b"r2"
    ]


async def test_keyless_halves_whose_source_partition_is_gone_still_meet(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> None:
    """Keyless dead letters of partition 7 of an input topic made again with 3 partitions:
    each was sent to a random partition, so a request's retrieval and final were split
    (decided incomplete, or misrouted). Both now go where the request id, as a key, would."""
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    t = settings.topics
    await create_topics(settings)
    rids = [f"kl-{i}" for i in range(10)]
    letters = [
        read_dead_letter(
            partition=0,
            offset=0,
            timestamp_ms=0,
            key=None,
            value=rid.encode(),
            headers=[
                ("x-dlq-reason", b"oversize"),
                ("x-dlq-source-topic", topic.encode()),
                ("x-dlq-source-partition", b"7"),
                ("x-dlq-request-id", rid.encode()),
            ],
        )
        for rid in rids
        for topic in (t.retrieval, t.generation)
    ]
    async with Redriver(settings, {t.retrieval, t.generation}) as redriver:
        for letter in letters:
            await redriver.send(letter)
    assert redriver.sent == 20
    where: dict[bytes, set[int]] = {}
    for topic in (t.retrieval, t.generation):
        for r in await read_settled(settings.kafka.bootstrap_servers, topic, settle_s=0.5):
            where.setdefault(r.value, set()).add(r.partition)
    assert where == {rid.encode(): {(murmur2(rid.encode()) & 0x7FFFFFFF) % 3} for rid in rids}
