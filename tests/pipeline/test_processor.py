from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import orjson
import pytest

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import AnswerVerdict, DeadLetterRecord, Decision
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import IDEMPOTENCY_HEADER, Destination, Step
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy
from tests.conftest import EventFactory, dumps

R, G = InputKind.RETRIEVAL, InputKind.GENERATION


class Feed:
    """Feeds a processor with consecutive offsets per topic."""

    def __init__(self, processor: Processor) -> None:
        self.processor = processor
        self.offsets: dict[str, int] = {}

    def __call__(
        self, kind: InputKind, raw: bytes | None, now_ms: float = 0.0, key: bytes | None = None
    ) -> Step:
        topic = f"rag.{kind.value}"
        off = self.offsets.get(topic, 0)
        self.offsets[topic] = off + 1
        ref = InputRef(topic, 0, off)
        return self.processor.on_message(kind, raw, key, ref, now_ms)


@pytest.fixture
def feed(settings_factory: Callable[..., Settings]) -> Feed:
    settings = settings_factory(join={"max_entries": 3, "ttl_ms": 1000})
    fixed = datetime(2026, 1, 1, tzinfo=UTC)
    return Feed(Processor(settings, PlaceholderPolicy(), wall_clock=lambda: fixed))


def verdict(step: Step) -> AnswerVerdict:
    [out] = [o for o in step.outputs if o.destination is Destination.VERDICTS]
    return AnswerVerdict.model_validate(orjson.loads(out.value))


@pytest.mark.parametrize("final_first", [False, True])
def test_two_halves_join_in_either_order(
    feed: Feed, retrieval_event: EventFactory, final_event: EventFactory, final_first: bool
) -> None:
    first, second = (G, final_event()), (R, retrieval_event())
    if not final_first:
        first, second = second, first
    step1 = feed(first[0], dumps(first[1]))
    assert step1.outputs == [] and step1.done == []
    step2 = feed(second[0], dumps(second[1]))
    v = verdict(step2)
    assert v.request_id == "req-1"
    assert v.decision is Decision.CAVEAT
    assert [r.code for r in v.reasons] == ["no-signals-configured"]
    assert {(ref.topic, ref.offset) for ref in step2.done} == {
        ("rag.retrieval", 0),
        ("rag.generation", 0),
    }
    assert step2.outputs[0].key == b"req-1"
    assert step2.outputs[0].header(IDEMPOTENCY_HEADER) == v.idempotency_key.encode()


def test_deltas_are_held_until_the_verdict_and_finished_with_it(
    feed: Feed, retrieval_event: EventFactory, final_event: EventFactory, delta_event: EventFactory
) -> None:
    feed(R, dumps(retrieval_event()))
    assert feed(G, dumps(delta_event(seq=1, text="lo"))).done == []
    assert feed(G, dumps(delta_event(seq=0, text="Hel"))).done == []
    entry = feed.processor.store.get("req-1")
    assert entry is not None and entry.streamed == "Hello"
    step = feed(G, dumps(final_event()))
    assert len(step.done) == 4  # retrieval, two deltas, final


def test_idempotency_key_is_stable_across_processors(
    settings_factory: Callable[..., Settings],
    retrieval_event: EventFactory,
    final_event: EventFactory,
) -> None:
    keys = set()
    for _ in range(2):
        f = Feed(Processor(settings_factory(), PlaceholderPolicy()))
        f(R, dumps(retrieval_event()))
        keys.add(verdict(f(G, dumps(final_event()))).idempotency_key)
    assert len(keys) == 1
    f = Feed(Processor(settings_factory(), PlaceholderPolicy()))
    f(R, dumps(retrieval_event()))
    other = verdict(f(G, dumps(final_event(answer="Something else.")))).idempotency_key
    assert other not in keys


def test_bad_input_becomes_a_dead_letter_with_original_bytes(feed: Feed) -> None:
    raw = b'{"schema_version": 1, "event_type": "retr'
    step = feed(R, raw, key=b"req-9")
    [out] = step.outputs
    assert out.destination is Destination.DLQ
    assert out.value == raw and out.key == b"req-9"
    record = DeadLetterRecord.from_headers(out.headers)
    assert record.reason == "malformed-json"
    assert record.source_topic == "rag.retrieval" and record.source_offset == 0
    assert record.request_id == "req-9"
    assert len(step.done) == 1
    assert feed.processor.counters.dead_letter_reasons == {"malformed-json": 1}


def test_key_must_match_request_id(feed: Feed, retrieval_event: EventFactory) -> None:
    step = feed(R, dumps(retrieval_event("req-1")), key=b"someone-else")
    record = DeadLetterRecord.from_headers(step.outputs[0].headers)
    assert record.reason == "key-mismatch"
    # the event's own request, once it was read (audit: it named the Kafka key, and an
    # unkeyed record that was read but refused named none)
    assert record.request_id == "req-1"
    event = retrieval_event("req-2")
    assert feed(R, dumps(event), key=None).outputs == []
    event["query"] += "?"  # another retrieval for req-2: read, then refused
    refused = DeadLetterRecord.from_headers(feed(R, dumps(event), key=None).outputs[0].headers)
    assert (refused.reason, refused.request_id) == ("duplicate-conflict", "req-2")
    event["tenant"] = "t" * 300  # refused by the model: no request was read
    unread = DeadLetterRecord.from_headers(feed(R, dumps(event), key=None).outputs[0].headers)
    assert (unread.reason, unread.request_id) == ("schema-violation", None)


def test_exact_duplicate_is_finished_quietly_conflict_is_dead_lettered(
    feed: Feed, retrieval_event: EventFactory
) -> None:
    feed(R, dumps(retrieval_event()))
    dup = feed(R, dumps(retrieval_event()))
    assert dup.outputs == [] and len(dup.done) == 1
    conflict = feed(R, dumps(retrieval_event(query="another question")))
    assert DeadLetterRecord.from_headers(conflict.outputs[0].headers).reason == "duplicate-conflict"
    assert feed.processor.counters.duplicates == 1


def test_events_after_the_decision_are_dead_lettered(
    feed: Feed, retrieval_event: EventFactory, final_event: EventFactory, delta_event: EventFactory
) -> None:
    feed(R, dumps(retrieval_event()))
    feed(G, dumps(final_event()))
    late = feed(G, dumps(delta_event(seq=5)), now_ms=10)
    assert DeadLetterRecord.from_headers(late.outputs[0].headers).reason == "after-final"
    assert feed.processor.store.get("req-1") is None


def test_ttl_turns_half_requests_into_block_incomplete(
    feed: Feed, retrieval_event: EventFactory
) -> None:
    feed(R, dumps(retrieval_event()), now_ms=0)
    assert feed.processor.on_tick(999).outputs == []
    step = feed.processor.on_tick(1000)
    v = verdict(step)
    assert v.decision is Decision.BLOCK
    assert v.reasons[0].code == "incomplete"
    assert "generation.final" in v.reasons[0].message
    assert len(step.done) == 1
    assert feed.processor.store.expirations == 1


def test_capacity_evicts_the_oldest_half_request(feed: Feed, retrieval_event: EventFactory) -> None:
    for i in range(3):
        assert feed(R, dumps(retrieval_event(f"req-{i}"))).outputs == []
    step = feed(R, dumps(retrieval_event("req-3")))
    v = verdict(step)
    assert v.request_id == "req-0" and v.decision is Decision.BLOCK
    assert "capacity" in v.reasons[0].message
    assert len(feed.processor.store) == 3
    assert feed.processor.store.evictions == 1


def test_delta_after_the_final_of_an_open_request_is_dead_lettered(
    feed: Feed, delta_event: EventFactory, final_event: EventFactory
) -> None:
    feed(G, dumps(final_event("req-x")))
    step = feed(G, dumps(delta_event("req-x", seq=0)))
    assert DeadLetterRecord.from_headers(step.outputs[0].headers).reason == "after-final"
    assert len(feed.processor.store) == 1


def test_tenant_from_a_trusted_header(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    p = Processor(settings_factory(tenancy={"source": "header"}), PlaceholderPolicy())
    offsets = iter(range(10))

    def reason(headers: tuple[tuple[str, bytes], ...]) -> str | None:
        off = next(offsets)
        event = dumps(retrieval_event(f"req-{off}"))
        step = p.on_message(R, event, None, InputRef("r", 0, off, headers), 0)
        return (
            DeadLetterRecord.from_headers(step.outputs[0].headers).reason if step.outputs else None
        )

    assert reason(()) == "untrusted-tenant"
    assert reason((("x-tenant", b""),)) == "untrusted-tenant"  # not a tenant called ""
    assert reason((("x-tenant", b"a" * 257),)) == "untrusted-tenant"
    # what an event's tenant may not hold, the header may not either (a generation event's
    # tenant comes from the header alone, unchecked against any event field)
    assert reason((("x-tenant", b"acme\x1b[2J"),)) == "untrusted-tenant"
    assert reason((("x-tenant", "acme\u202e".encode()),)) == "untrusted-tenant"
    assert reason((("x-tenant", b"globex"),)) == "tenant-mismatch"
    assert reason((("x-tenant", b"acme"),)) is None


def test_fixed_tenant_rejects_other_tenants(
    settings_factory: Callable[..., Settings], retrieval_event: EventFactory
) -> None:
    p = Processor(
        settings_factory(tenancy={"source": "fixed", "tenant": "globex"}), PlaceholderPolicy()
    )
    step = p.on_message(R, dumps(retrieval_event()), None, InputRef("r", 0, 0), 0)
    assert DeadLetterRecord.from_headers(step.outputs[0].headers).reason == "tenant-mismatch"
