"""Hostile and sloppy producers against a real sidecar process and the real broker.

Each case sends what an adversarial or careless producer would (finite but
absurd numbers, limits exceeded, another tenant's request ids, floods of
labels, late re-sends) between ordinary requests, and checks the contract:
one bad record costs that record only — every ordinary request gets exactly
one verdict, the bad record is dead-lettered with a named reason, and the
committed offsets reach the end of every input partition.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.kafka.topics import create_topics
from sidecar.lab.chaos.process import SidecarProcess
from sidecar.lab.localkafka.broker import LocalKafka
from sidecar.lab.replay import Record, send
from sidecar.pipeline.outputs import idempotency_key
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import committed, read_settled, settings_for

pytestmark = pytest.mark.connected


@pytest.fixture
def env(kafka_broker: LocalKafka, unique_topics: dict[str, str]) -> Iterator[dict[str, str]]:
    t = unique_topics
    yield {
        "GUARDRAIL_KAFKA__BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "GUARDRAIL_KAFKA__GROUP_ID": t["group"],
        "GUARDRAIL_JOIN__TTL_MS": "4000",
        "GUARDRAIL_JOIN__SWEEP_INTERVAL_MS": "100",
        **{
            f"GUARDRAIL_TOPICS__{name.upper()}": topic
            for name, topic in t.items()
            if name != "group"
        },
    }


def blake(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


async def wait_for_verdicts(bootstrap: str, topic: str, ids: set[str], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        got = {r.key.decode() for r in await read_settled(bootstrap, topic, 0.3)}
        if ids <= got:
            return
    raise TimeoutError(f"no verdict for {sorted(ids - got)} within {timeout_s}s")


def verdicts_by_id(records: list[Any]) -> dict[str, list[dict[str, Any]]]:
    import orjson

    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        v = orjson.loads(r.value)
        out.setdefault(v["request_id"], []).append(v)
    return out


def dlq_reasons(records: list[Any]) -> Counter[str]:
    return Counter(dict(r.headers)["x-dlq-reason"].decode() for r in records)


async def test_poison_values_and_exceeded_limits_cost_one_record_each(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    proc = SidecarProcess(
        {**env, "GUARDRAIL_LIMITS__MAX_HITS": "10", "GUARDRAIL_LIMITS__MAX_ANSWER_CHARS": "100"},
        tmp_path / "sidecar.log",
    )
    proc.start()
    ordinary = [f"req-ok{i}" for i in range(6)]
    records: list[Record] = []

    def request(rid: str, retrieval: dict[str, Any], final: dict[str, Any]) -> None:
        records.append(Record(t.retrieval, rid.encode(), dumps(retrieval)))
        records.append(Record(t.generation, rid.encode(), dumps(final)))

    for i, rid in enumerate(ordinary[:3]):
        request(rid, retrieval_event(rid), final_event(rid))
        if i == 1:  # poison in the middle of the burst
            poison = retrieval_event("req-poison")
            poison["hits"][0]["score"] = 1e308  # valid JSON, finite, absurd
            request("req-poison", poison, final_event("req-poison"))
            wide = retrieval_event("req-wide", k=300)
            wide["hits"] = [
                {**wide["hits"][0], "chunk_id": f"c{j}", "score": 0.5} for j in range(300)
            ]
            request("req-wide", wide, final_event("req-wide"))
            request(
                "req-long", retrieval_event("req-long"), final_event("req-long", answer="x" * 1000)
            )
    records.append(Record(t.retrieval, b"..", dumps(retrieval_event(".."))))
    for rid in ordinary[3:]:
        request(rid, retrieval_event(rid), final_event(rid))
    # a streamed answer longer than the limit: the delta that crosses it is dead-lettered
    records.append(Record(t.retrieval, b"req-stream", dumps(retrieval_event("req-stream"))))
    records.extend(
        Record(t.generation, b"req-stream", dumps(delta_event("req-stream", seq, "y" * 40)))
        for seq in range(3)
    )
    records.append(Record(t.generation, b"req-stream", dumps(final_event("req-stream"))))
    try:
        await send(settings, records)
        await wait_for_verdicts(kafka_broker.bootstrap_servers, t.verdicts, set(ordinary), 60)
        # a final re-sent after its request was decided (and after the join TTL)
        await asyncio.sleep(5.0)
        again = Record(t.generation, b"req-ok0", dumps(final_event("req-ok0")))
        await send(settings, [again])
        await asyncio.sleep(3.0)
        verdicts = verdicts_by_id(await read_settled(kafka_broker.bootstrap_servers, t.verdicts))
        dead = await read_settled(kafka_broker.bootstrap_servers, t.dlq)
        done = await committed(kafka_broker.bootstrap_servers, unique_topics["group"])
    finally:
        proc.signal(signal.SIGTERM)
    for rid in ordinary:  # exactly one verdict, decided on its merits
        [v] = verdicts[rid]
        assert not [r for r in v["reasons"] if r["code"] in {"incomplete", "internal-error"}], v
    # a request whose retrieval or final was refused is decided at once, naming it (before:
    # after the join TTL, "missing: generation.final" though the final had come)
    for rid, why in (("req-wide", "too-many-hits"), ("req-long", "answer-too-long")):
        [v] = verdicts[rid]
        assert v["reasons"][0]["code"] == "incomplete", v
        assert f"dead-lettered ({why}:" in v["reasons"][0]["message"], v
    reasons = dlq_reasons(dead)
    assert reasons["score-out-of-range"] == 1
    assert reasons["too-many-hits"] == 1
    assert reasons["answer-too-long"] >= 2  # the long final, the delta crossing the limit
    assert reasons["schema-violation"] >= 1  # request id ".."
    assert reasons["after-final"] == 1  # the late re-send: no second verdict
    assert "req-ok0" in verdicts and len(verdicts["req-ok0"]) == 1
    # every input record was finished: the committed offsets reach the end
    assert sum(done.values()) == len(records) + 1, (done, len(records))


async def test_one_tenant_cannot_complete_or_claim_another_tenants_request(
    kafka_broker: LocalKafka,
    unique_topics: dict[str, str],
    env: dict[str, str],
    tmp_path: Path,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    settings = settings_for(unique_topics, kafka_broker.bootstrap_servers)
    await create_topics(settings)
    t = settings.topics
    proc = SidecarProcess(
        {**env, "GUARDRAIL_TENANCY__SOURCE": "header", "GUARDRAIL_TENANCY__HEADER": "x-tenant"},
        tmp_path / "sidecar.log",
    )
    proc.start()
    a, b = [("x-tenant", b"tenant-a")], [("x-tenant", b"tenant-b")]
    # tenant A injects the final answer of B's request, and claims another of B's ids first
    injected = dumps(final_event("req-b1", answer="INJECTED BY TENANT A"))
    claim_first = dumps(retrieval_event("req-b2", tenant="tenant-a"))
    b1_retrieval = dumps(retrieval_event("req-b1", tenant="tenant-b"))
    b1_final = dumps(final_event("req-b1"))
    b2_retrieval = dumps(retrieval_event("req-b2", tenant="tenant-b"))
    b2_final = dumps(final_event("req-b2"))
    records = [
        Record(t.generation, b"req-b1", injected, a),
        Record(t.retrieval, b"req-b2", claim_first, a),
        Record(t.retrieval, b"req-b1", b1_retrieval, b),
        Record(t.generation, b"req-b1", b1_final, b),
        Record(t.retrieval, b"req-b2", b2_retrieval, b),
        Record(t.generation, b"req-b2", b2_final, b),
        # no trusted header at all: not admitted
        Record(t.generation, b"req-b3", dumps(delta_event("req-b3", 0, "hi"))),
        # a retrieval whose body names another tenant than its trusted header
        Record(t.retrieval, b"req-b4", dumps(retrieval_event("req-b4", tenant="tenant-b")), a),
    ]
    try:
        await send(settings, records)
        await wait_for_verdicts(
            kafka_broker.bootstrap_servers, t.verdicts, {"req-b1", "req-b2"}, 60
        )
        # A's half-requests expire on their own, in A's name
        await asyncio.sleep(6.0)
        verdicts = verdicts_by_id(await read_settled(kafka_broker.bootstrap_servers, t.verdicts))
        dead = await read_settled(kafka_broker.bootstrap_servers, t.dlq)
    finally:
        proc.signal(signal.SIGTERM)
    decided_b = {rid: [v for v in vs if v["tenant"] == "tenant-b"] for rid, vs in verdicts.items()}
    # B's verdicts were decided on B's own events (the key is derived from their bytes)
    [b1] = decided_b["req-b1"]
    assert b1["idempotency_key"] == idempotency_key("req-b1", blake(b1_retrieval), blake(b1_final))
    [b2] = decided_b["req-b2"]
    assert b2["idempotency_key"] == idempotency_key("req-b2", blake(b2_retrieval), blake(b2_final))
    # whatever A's events produced is A's: incomplete, in A's name
    for vs in verdicts.values():
        for v in vs:
            if v["tenant"] != "tenant-b":
                assert v["tenant"] == "tenant-a"
                assert [r["code"] for r in v["reasons"]] == ["incomplete"]
    reasons = dlq_reasons(dead)
    assert reasons["untrusted-tenant"] == 1
    assert reasons["tenant-mismatch"] == 1
