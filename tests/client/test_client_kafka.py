"""The client against a real broker and a real sidecar process: verdicts, replicas, fallbacks."""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.sdk.trace import TracerProvider

from bench.verdict_client import GENERATOR, HITS, run_replicas
from guardrail_client import (
    Decision,
    GuardrailPublisher,
    SyncGuardrailPublisher,
    SyncVerdictClient,
    VerdictClient,
    VerdictResult,
    VerdictTimeoutError,
)
from sidecar.config import Settings
from tests.client.conftest import SidecarFactory
from tests.conftest import EventFactory, dumps
from tests.kafka.harness import read_settled

pytestmark = pytest.mark.connected

QUERY = "who wrote frankenstein"
ANSWER = "Frankenstein was written by Mary Shelley."
RETRIEVER = "qdrant-minilm-l6"
ROLLING = {"retrieval": {"monitor", "m1_mean"}}  # the monitor's rolling state moves per request


def publisher(settings: Settings) -> GuardrailPublisher:
    t = settings.topics
    return GuardrailPublisher(
        settings.kafka.bootstrap_servers,
        generator_model=GENERATOR,
        retrieval_topic=t.retrieval,
        generation_topic=t.generation,
    )


def verdict_client(settings: Settings, **options: object) -> VerdictClient:
    t = settings.topics
    return VerdictClient(
        settings.kafka.bootstrap_servers,
        verdicts_topic=t.verdicts,
        claims_topic=t.claims,
        **options,  # type: ignore[arg-type]
    )


async def test_published_events_get_the_verdict_of_the_same_hand_written_events(
    client_settings: Settings,
    start_sidecar: SidecarFactory,
    retrieval_event: EventFactory,
    final_event: EventFactory,
    delta_event: EventFactory,
) -> None:
    """The kit's events decide exactly as the contract's own JSON does, traced end to end."""
    settings, t = client_settings, client_settings.topics
    start_sidecar()
    tracer = TracerProvider().get_tracer("llm-service")
    async with publisher(settings) as pub, verdict_client(settings, timeout_s=60) as verdicts:
        with tracer.start_as_current_span("rag-request") as span:
            await pub.retrieval(
                "kit-1", QUERY, HITS, tenant="acme", collection="wiki", retriever=RETRIEVER
            )
            await pub.delta("kit-1", "Frankenstein was written ")
            await pub.delta("kit-1", "by Mary Shelley.")
            await pub.final("kit-1", ANSWER)
        trace_id = f"{span.get_span_context().trace_id:032x}"
        raw = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await raw.start()
        try:
            hits = retrieval_event("hand-1")["hits"]
            assert hits == HITS  # the same inputs on both paths
            for topic, event in (
                (t.retrieval, retrieval_event("hand-1", retriever=RETRIEVER)),
                (t.generation, delta_event("hand-1", 0, "Frankenstein was written ")),
                (t.generation, delta_event("hand-1", 1, "by Mary Shelley.")),
                (t.generation, final_event("hand-1", answer=ANSWER, deltas=2)),
            ):
                await raw.send_and_wait(topic, dumps(event), key=b"hand-1")
        finally:
            await raw.stop()
        kit, hand = await asyncio.gather(verdicts.verdict("kit-1"), verdicts.verdict("hand-1"))
    assert kit.from_sidecar and hand.from_sidecar
    assert kit.verdict is not None and hand.verdict is not None
    assert kit.decision is hand.decision
    assert [r.code for r in kit.verdict.reasons] == [r.code for r in hand.verdict.reasons]
    assert kit.verdict.signals.model_dump(exclude=ROLLING) == hand.verdict.signals.model_dump(
        exclude=ROLLING
    )
    assert kit.verdict.confidence == hand.verdict.confidence
    assert await read_settled(settings.kafka.bootstrap_servers, t.dlq, settle_s=0.5) == []
    [record] = [
        r
        for r in await read_settled(settings.kafka.bootstrap_servers, t.verdicts, settle_s=1.5)
        if r.key == b"kit-1"
    ]
    traceparent = dict(record.headers)["traceparent"].decode()
    assert traceparent.split("-")[1] == trace_id  # the service's trace continues in the verdict


async def test_sync_publisher_numbers_deltas_and_names_the_tenant(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    settings, t = client_settings, client_settings.topics
    start_sidecar()
    sync = SyncGuardrailPublisher(
        settings.kafka.bootstrap_servers,
        generator_model=GENERATOR,
        retrieval_topic=t.retrieval,
        generation_topic=t.generation,
    )
    async with verdict_client(settings, timeout_s=60) as verdicts:
        await asyncio.to_thread(sync.start)
        try:
            sync.retrieval("sync-1", QUERY, HITS, tenant="acme", collection="wiki")
            for piece in ("Frankenstein ", "was written ", "by Mary Shelley."):
                sync.delta("sync-1", piece)
            sync.final("sync-1", ANSWER)
            await asyncio.to_thread(sync.flush, 30.0)
        finally:
            await asyncio.to_thread(sync.stop)
        result = await verdicts.verdict("sync-1")
    assert result.from_sidecar
    assert sync.stats.delivered == 5 and sync.stats.dropped == sync.stats.failed == 0
    generation = await read_settled(settings.kafka.bootstrap_servers, t.generation, settle_s=0.5)
    events = [orjson.loads(r.value) for r in generation]
    assert [e.get("seq") for e in events] == [0, 1, 2, None]
    assert events[-1]["deltas"] == 3
    assert all(dict(r.headers)["x-tenant"] == b"acme" for r in generation)
    assert len({r.partition for r in generation}) == 1


def test_a_threaded_service_gets_each_requests_verdict_on_its_own_thread(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    """Flask-style: each request handled on a thread of its own, publishing with the sync
    publisher and blocking on the sync verdict client until its verdict comes."""
    settings, t = client_settings, client_settings.topics
    start_sidecar()
    bootstrap = settings.kafka.bootstrap_servers

    def handle(rid: str) -> VerdictResult:
        verdicts.expect(rid)
        pub.retrieval(rid, QUERY, HITS, tenant="acme", collection="wiki")
        pub.delta(rid, "Frankenstein was written ")
        pub.final(rid, ANSWER)
        return verdicts.verdict(rid, 90.0, tenant="acme")

    with (
        SyncGuardrailPublisher(
            bootstrap,
            generator_model=GENERATOR,
            retrieval_topic=t.retrieval,
            generation_topic=t.generation,
        ) as pub,
        SyncVerdictClient(bootstrap, verdicts_topic=t.verdicts, claims_topic=t.claims) as verdicts,
        ThreadPoolExecutor(6) as pool,
    ):
        rids = [f"thread-{i}" for i in range(24)]
        results = dict(zip(rids, pool.map(handle, rids), strict=True))
    assert all(r.from_sidecar for r in results.values()), [
        (rid, r.source) for rid, r in results.items() if not r.from_sidecar
    ]
    assert all(r.verdict is not None and r.verdict.request_id == rid for rid, r in results.items())
    assert pub.stats.delivered == 3 * len(rids)


async def test_three_replicas_each_get_their_own_verdicts_for_1000_concurrent_requests(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    """The measured run is bench/verdict_client.py; here: every waiter gets its own verdict."""
    settings = client_settings
    start_sidecar()
    topics = {
        name: getattr(settings.topics, name)
        for name in ("retrieval", "generation", "claims", "verdicts")
    }
    per_replica, clients = await run_replicas(
        settings.kafka.bootstrap_servers, topics, requests=1000, replicas=3, timeout_s=240
    )
    assert [len(rs) for rs in per_replica] == [334, 333, 333]
    for r, results in enumerate(per_replica):
        assert all(res.from_sidecar for res in results), [
            res.request_id for res in results if not res.from_sidecar
        ][:5]
        assert all(res.request_id.startswith(f"r{r}-") for res in results)
        assert all(
            res.verdict is not None and res.verdict.request_id == res.request_id for res in results
        )
    for client, results in zip(clients, per_replica, strict=True):
        assert client.records_read == 1000  # every replica reads every verdict ...
        assert client.waiters.decoded == len(results)  # ... and decodes only its own


async def test_timeout_falls_back_as_configured_when_no_sidecar_runs(
    client_settings: Settings,
) -> None:
    settings = client_settings
    async with publisher(settings) as pub:
        await pub.retrieval("down-1", QUERY, HITS, tenant="acme", collection="wiki")
        await pub.final("down-1", ANSWER)
        await pub.flush()
        for on_timeout, decision in (("allow", Decision.ALLOW), ("block", Decision.BLOCK)):
            async with verdict_client(settings, on_timeout=on_timeout) as verdicts:
                result = await verdicts.verdict("down-1", timeout=0.5)
            assert result.decision is decision
            assert result.source == "timeout" and not result.from_sidecar
            assert result.verdict is None and result.waited_s >= 0.5
        async with verdict_client(settings, on_timeout="raise") as verdicts:
            with pytest.raises(VerdictTimeoutError) as caught:
                await verdicts.verdict("down-1", timeout=0.3)
            assert caught.value.source == "timeout" and caught.value.retriable
    idle = verdict_client(settings, on_timeout="block")  # never started: no waiting at all
    result = await idle.verdict("down-1", timeout=30)
    assert (result.source, result.decision, result.waited_s) == ("unavailable", Decision.BLOCK, 0.0)


async def test_a_sidecar_that_stops_gives_timeouts_and_its_late_verdict_is_still_found(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    settings = client_settings
    proc = start_sidecar()
    async with publisher(settings) as pub, verdict_client(settings, timeout_s=60) as verdicts:

        async def request(rid: str) -> None:
            await pub.retrieval(rid, QUERY, HITS, tenant="acme", collection="wiki")
            await pub.final(rid, ANSWER)
            await pub.flush()

        await request("before-stop")
        assert (await verdicts.verdict("before-stop")).from_sidecar
        await asyncio.to_thread(proc.signal, signal.SIGTERM)
        await request("while-down")
        down = await verdicts.verdict("while-down", timeout=1.0)
        assert (down.source, down.decision) == ("timeout", Decision.ALLOW)
        start_sidecar()  # the group resumes from its committed offsets and decides it
        late = await verdicts.verdict("while-down", timeout=60)
        assert late.from_sidecar and late.verdict is not None


async def test_an_expected_verdict_is_found_after_the_fleets_traffic_turned_the_cache_over(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    """A caller that streams its answer first and asks for the verdict after: meanwhile
    the verdicts of other requests pass (every replica's client reads them all). With
    ``expect`` the early verdict is still there; without, it left the recent cache."""
    settings = client_settings
    start_sidecar()
    options = {"timeout_s": 60, "recent_max_entries": 20}
    async with publisher(settings) as pub, verdict_client(settings, **options) as verdicts:

        async def request(rid: str) -> None:
            await pub.retrieval(rid, QUERY, HITS, tenant="acme", collection="wiki")
            await pub.final(rid, ANSWER)

        verdicts.expect("announced")
        await request("announced")
        await request("not-announced")
        for i in range(120):  # the rest of the fleet
            await request(f"other-{i}")
        await pub.flush()
        await verdicts.verdict("other-119")  # read past both
        for _ in range(200):  # and past every other verdict
            if verdicts.records_read >= 122:
                break
            await asyncio.sleep(0.05)
        announced = await verdicts.verdict("announced", timeout=0)
        assert announced.from_sidecar and announced.verdict is not None
        assert announced.verdict.request_id == "announced"
        assert (await verdicts.verdict("not-announced", timeout=0)).source == "timeout"


async def test_claims_stream_the_requests_claim_verdicts_and_end_after_its_verdict(
    client_settings: Settings, start_sidecar: SidecarFactory
) -> None:
    settings = client_settings
    start_sidecar(GUARDRAIL_SIGNALS__CLAIMS="true")
    answer = "Frankenstein was written by Mary Shelley. It is a gothic novel."
    async with publisher(settings) as pub, verdict_client(settings, timeout_s=60) as verdicts:
        await pub.retrieval("claims-1", QUERY, HITS, tenant="acme", collection="wiki")
        await pub.delta("claims-1", "Frankenstein was written by Mary Shelley. ")
        await pub.delta("claims-1", "It is a gothic novel.")
        await pub.final("claims-1", answer)
        claims = [c async for c in verdicts.claims("claims-1")]
        result = await verdicts.verdict("claims-1")  # already here: from the recent cache
    assert result.from_sidecar and result.verdict is not None
    counted = result.verdict.signals.claims
    assert counted.status == "ok" and counted.n >= 1
    assert len(claims) == counted.n + len(counted.superseded_claims)
    assert all(c.request_id == "claims-1" for c in claims)
    assert sorted(c.claim_index for c in claims) == list(range(len(claims)))
    assert {c.text for c in claims} <= {answer[c.span[0] : c.span[1]] for c in claims}
