"""Offsets are committed only after the verdict is published (real broker only)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import committed, read_settled, real_harness, settings_for, wait_until

pytestmark = pytest.mark.connected


async def test_commit_waits_for_the_verdict_publish(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    async with real_harness(settings) as h:
        gate = asyncio.Event()
        original = h.service.publisher.send_output

        async def gated_send(*args: Any, **kwargs: Any) -> Any:
            await gate.wait()
            return await original(*args, **kwargs)

        h.service.publisher.send_output = gated_send  # type: ignore[method-assign]
        t = settings.topics
        await h.publish(t.retrieval, dumps(retrieval_event("req-c")), b"req-c")
        await h.publish(t.generation, dumps(final_event("req-c")), b"req-c")
        await wait_until(lambda: h.service.tracker.pending_count() == 2, 20, "both halves consumed")
        await asyncio.sleep(1.0)  # ten sweep ticks, each of which tries to commit
        before = await committed(settings.kafka.bootstrap_servers, unique_topics["group"])
        assert all(off == 0 for off in before.values()), before
        assert await h.collect(t.verdicts, 1, timeout_s=0.5) == []
        gate.set()
        assert len(await h.collect(t.verdicts, 1)) == 1
        await wait_until(lambda: h.service.tracker.pending_count() == 0, 10, "inputs finished")
        await wait_until(
            lambda: h.service.state.commits > 0 and not h.service.tracker.committable(),
            10,
            "commit",
        )
        after = await committed(settings.kafka.bootstrap_servers, unique_topics["group"])
        assert sum(after.values()) == 2  # one past each input message


# ---------------------------------------------------------------- crash and restart


@pytest.fixture
def sidecar_env(
    kafka_broker: LocalKafka, unique_topics: dict[str, str]
) -> Iterator[dict[str, str]]:
    t = unique_topics
    env = {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "GUARDRAIL_KAFKA__GROUP_ID": t["group"],
        "GUARDRAIL_TOPICS__RETRIEVAL": t["retrieval"],
        "GUARDRAIL_TOPICS__GENERATION": t["generation"],
        "GUARDRAIL_TOPICS__CLAIMS": t["claims"],
        "GUARDRAIL_TOPICS__VERDICTS": t["verdicts"],
        "GUARDRAIL_TOPICS__DLQ": t["dlq"],
        "GUARDRAIL_TOPICS__FEEDBACK": t["feedback"],
        "GUARDRAIL_TOPICS__REPORTS": t["reports"],
        "GUARDRAIL_TOPICS__CERTIFICATES": t["certificates"],
    }
    yield env


async def read_all(bootstrap: str, topic: str, settle_s: float = 2.0) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in await read_settled(bootstrap, topic, settle_s)]


async def test_kill_between_publish_and_commit_redelivers_never_loses(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    sidecar_env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    ids = [f"req-k{i}" for i in range(6)]
    records = []
    for rid in ids:
        records.append(Record(t.retrieval, rid.encode(), dumps(retrieval_event(rid))))
        records.append(Record(t.generation, rid.encode(), dumps(final_event(rid))))

    # 1st life: publishes verdicts, never commits (the sweep that commits is an hour away)
    never_commits = SidecarProcess(
        {**sidecar_env, "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "3600000"}, tmp_path / "1.log"
    )
    never_commits.start()
    await send(settings, records)
    for _ in range(300):
        if len(await read_all(kafka_broker.bootstrap_servers, t.verdicts, 0.3)) >= len(ids):
            break
    assert never_commits.signal(signal.SIGKILL) == -signal.SIGKILL
    assert await committed(kafka_broker.bootstrap_servers, unique_topics["group"]) == {}

    # 2nd life: re-reads from the (absent) committed offsets and publishes again
    second = SidecarProcess(sidecar_env, tmp_path / "2.log")
    second.start()
    for _ in range(300):
        if len(await read_all(kafka_broker.bootstrap_servers, t.verdicts, 0.3)) >= 2 * len(ids):
            break
    assert second.signal(signal.SIGTERM) == 0
    verdicts = await read_all(kafka_broker.bootstrap_servers, t.verdicts)
    by_id: dict[str, set[str]] = {}
    for v in verdicts:
        by_id.setdefault(v["request_id"], set()).add(v["idempotency_key"])
    assert set(by_id) == set(ids)  # never zero times
    assert len(verdicts) == 2 * len(ids)  # here exactly twice: once per life
    assert all(len(keys) == 1 for keys in by_id.values())  # duplicates are recognisable

    # the graceful stop committed everything: a 3rd life publishes nothing new
    done = await committed(kafka_broker.bootstrap_servers, unique_topics["group"])
    assert sum(done.values()) == len(records)
    third = SidecarProcess(sidecar_env, tmp_path / "3.log")
    third.start()
    await asyncio.sleep(2.0)
    assert third.signal(signal.SIGTERM) == 0
    assert len(await read_all(kafka_broker.bootstrap_servers, t.verdicts)) == 2 * len(ids)


async def test_sigterm_leaves_half_requests_to_the_next_owner_without_writing_input_topics(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    sidecar_env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    complete = [f"req-c{i}" for i in range(5)]
    halves = [f"req-h{i}" for i in range(4)]
    records = []
    for rid in complete:
        records.append(Record(t.retrieval, rid.encode(), dumps(retrieval_event(rid))))
        records.append(Record(t.generation, rid.encode(), dumps(final_event(rid))))
    records += [Record(t.retrieval, rid.encode(), dumps(retrieval_event(rid))) for rid in halves]

    first = SidecarProcess(sidecar_env, tmp_path / "1.log")
    first.start()
    await send(settings, records)
    for _ in range(300):
        if len(await read_all(kafka_broker.bootstrap_servers, t.verdicts, 0.3)) >= len(complete):
            break
    await asyncio.sleep(1.0)  # the half-requests are consumed and held open
    assert first.signal(signal.SIGTERM) == 0
    done = await committed(kafka_broker.bootstrap_servers, unique_topics["group"])
    # open half-requests keep their offsets: the committed position stops before them
    assert sum(done.values()) < len(records)
    # and nothing was written into the LLM service's topics
    assert len(await read_all(kafka_broker.bootstrap_servers, t.retrieval)) == len(complete) + len(
        halves
    )
    assert len(await read_all(kafka_broker.bootstrap_servers, t.generation)) == len(complete)

    second = SidecarProcess(sidecar_env, tmp_path / "2.log")
    second.start()
    await send(settings, [Record(t.generation, r.encode(), dumps(final_event(r))) for r in halves])
    for _ in range(300):
        got = await read_all(kafka_broker.bootstrap_servers, t.verdicts, 0.3)
        if {v["request_id"] for v in got} >= set(complete + halves):
            break
    await asyncio.sleep(1.0)
    assert second.signal(signal.SIGTERM) == 0
    verdicts = await read_all(kafka_broker.bootstrap_servers, t.verdicts)
    keys: dict[str, set[str]] = {}
    for v in verdicts:
        keys.setdefault(v["request_id"], set()).add(v["idempotency_key"])
    assert set(keys) == set(complete + halves)  # nothing lost
    assert all(len(k) == 1 for k in keys.values())  # re-read duplicates are recognisable
    assert sorted({v["request_id"] for v in verdicts if v["request_id"] in halves}) == halves
    # joined by the next owner, not evicted half-requests
    assert not [v for v in verdicts if any(r["code"] == "incomplete" for r in v["reasons"])]
    final_commit = await committed(kafka_broker.bootstrap_servers, unique_topics["group"])
    assert sum(final_commit.values()) == len(records) + len(halves)
