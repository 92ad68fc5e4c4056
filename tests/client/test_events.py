"""The event builder and publisher checks, without Kafka: contracts, seq numbers, headers, keys."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from aiokafka.partitioner import murmur2
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

from guardrail_client import (
    AttentionSummary,
    ClientNotStartedError,
    EventBuilder,
    GuardrailPublisher,
    InvalidEventError,
    OutgoingRecord,
    PartitionerWarning,
    SidecarLimits,
    partition_for,
)
from guardrail_client.keys import murmur2 as fast_murmur2
from sidecar.config import LimitSettings
from sidecar.contracts.codec import InputKind, decode_input
from sidecar.pipeline.intake import MAX_DELTAS_PER_REQUEST
from tests.client.fakes import FakeProducer

HITS = [{"chunk_id": "c1", "doc_id": "d1", "score": 0.7, "text": "Mary Shelley wrote it."}]


def builder(**overrides: Any) -> EventBuilder:
    return EventBuilder(
        retrieval_topic="rag.retrieval",
        generation_topic="rag.generation",
        generator_model="gen",
        **overrides,
    )


def decoded(kind: InputKind, value: bytes) -> Any:
    return decode_input(kind, value, max_bytes=1 << 20, max_depth=32)


def test_events_decode_as_the_sidecar_decodes_them_with_gapless_seq_and_the_delta_count() -> None:
    b = builder()
    ret = b.retrieval("r-1", "q", HITS, tenant="acme", collection="wiki")
    deltas = [b.delta("r-1", piece) for piece in ("a", "b", "c")]
    fin = b.final("r-1", "abc", logprob=-0.4)
    assert decoded(InputKind.RETRIEVAL, ret.value) == ret.event
    assert ret.event.k == 1 and ret.topic == "rag.retrieval"
    assert [decoded(InputKind.GENERATION, d.value).seq for d in deltas] == [0, 1, 2]
    final = decoded(InputKind.GENERATION, fin.value)
    assert (final.deltas, final.mean_token_logprob, final.generator_model) == (3, -0.4, "gen")
    records: list[OutgoingRecord[Any]] = [ret, *deltas, fin]
    assert {r.key for r in records} == {b"r-1"}
    assert all(dict(r.headers)["x-tenant"] == b"acme" for r in records)
    assert b.open_requests == 0  # the final forgets the request


def test_a_request_id_used_already_is_refused_before_it_reaches_kafka() -> None:
    """Audit: an id reused for another answer got its events dead-lettered (after-final)
    while the verdict client handed back the first answer's verdict as the second's."""
    b = builder()
    b.retrieval("r-1", "q", HITS, tenant="acme", collection="wiki")
    b.delta("r-1", "a")
    b.final("r-1", "a")
    for again in (
        lambda: b.delta("r-1", "again"),
        lambda: b.final("r-1", "again"),
        lambda: b.retrieval("r-1", "q2", HITS, tenant="acme", collection="wiki"),
    ):
        with pytest.raises(InvalidEventError, match="'r-1' was used already"):
            again()
    assert b.open_requests == 0
    # a request's halves in either order: its retrieval after its final, once
    b.final("r-2", "b")
    b.retrieval("r-2", "q", HITS, tenant="acme", collection="wiki")
    with pytest.raises(InvalidEventError, match="its retrieval and final were sent"):
        b.retrieval("r-2", "q", HITS, tenant="acme", collection="wiki")
    b.retrieval("r-3", "q", HITS, tenant="acme", collection="wiki")
    with pytest.raises(InvalidEventError, match="its retrieval was sent"):
        b.retrieval("r-3", "q", HITS, tenant="acme", collection="wiki")


def test_a_refused_delta_opens_no_request() -> None:
    """Audit: 1,000 deltas refused for their id left 1,000 open requests in the builder
    (past max_open_requests they push real ones out)."""
    b = builder()
    for i in range(50):
        with pytest.raises(InvalidEventError, match="request_id"):
            b.delta(f"ünï-{i}", "x")
    assert b.open_requests == 0


def test_a_request_without_a_retrieval_carries_no_tenant_header() -> None:
    b = builder()
    assert "x-tenant" not in dict(b.delta("r-2", "x").headers)
    assert "x-tenant" not in dict(
        builder(tenant_header=None)
        .retrieval("r-3", "q", HITS, tenant="acme", collection="wiki")
        .headers
    )


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda b: b.retrieval("../", "q", HITS, tenant="t", collection="c"), "request_id"),
        (lambda b: b.retrieval("r", "q", HITS, tenant="t", collection="c", k=0), "k"),
        (
            lambda b: b.retrieval(
                "r", "q", [{**HITS[0], "score": float("nan")}], tenant="t", collection="c"
            ),
            "score",
        ),
        (lambda b: b.retrieval("r", "q", HITS, tenant="", collection="c"), "tenant"),
        (lambda b: b.final("r", "a", logprob=0.5), "mean_token_logprob"),
        (lambda b: b.final("r", "a", attention=np.zeros((2, 2))), "attention"),
        (lambda b: b.delta("r" * 129, "x"), "request_id"),
    ],
)
def test_a_contract_violation_raises_at_the_call_site_and_names_the_field(
    call: Any, field: str
) -> None:
    with pytest.raises(InvalidEventError) as caught:
        call(builder())
    assert field in caught.value.detail


def test_an_attention_array_becomes_the_float16_summary() -> None:
    array = np.random.default_rng(7).random((2, 3, 4)).astype(np.float32)
    fin = builder().final("r", "a", attention=array)
    summary = decoded(InputKind.GENERATION, fin.value).attention
    assert isinstance(summary, AttentionSummary)
    np.testing.assert_allclose(summary.to_array(), array, atol=1e-3)


@pytest.mark.parametrize(
    ("value", "message"),
    [(float("nan"), "finite"), (float("inf"), "finite"), (-0.5, ">= 0")],
)
def test_an_attention_array_the_sidecar_would_refuse_raises_at_the_call(
    value: float, message: str
) -> None:
    array = np.full((2, 3, 4), 0.5)
    array[1, 2, 3] = value
    with pytest.raises(InvalidEventError, match=message):
        builder().final("r", "a", attention=array)


@pytest.mark.filterwarnings("error")  # no overflow warning from the float16 cast
def test_attention_above_the_float16_range_is_clipped_to_it_and_accepted() -> None:
    array = np.full((2, 3, 4), 0.5)
    array[0, 0, 0] = 1e6
    fin = builder().final("r", "a", attention=array)
    summary = decoded(InputKind.GENERATION, fin.value).attention
    assert isinstance(summary, AttentionSummary)
    assert summary.to_array()[0, 0, 0] == np.finfo(np.float16).max


def test_the_current_span_travels_as_traceparent() -> None:
    tracer = TracerProvider().get_tracer("svc")
    assert "traceparent" not in dict(builder().delta("r", "x").headers)  # no span: no header
    with tracer.start_as_current_span("req") as span:
        headers = dict(builder().delta("r", "x").headers)
    ctx = span.get_span_context()
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert headers["traceparent"] == expected.encode()


def test_open_requests_are_bounded_oldest_forgotten_first() -> None:
    b = builder(max_open_requests=2)
    for rid in ("a", "b", "c"):
        b.delta(rid, "x")
    assert b.open_requests == 2
    assert b.delta("a", "y").event.seq == 0  # forgotten: restarts
    assert b.delta("c", "y").event.seq == 1


def first_partition(key: bytes, all_partitions: list[int], available: list[int]) -> int:
    return all_partitions[0]


def test_a_partitioner_other_than_murmur2_is_warned_about() -> None:
    with pytest.warns(PartitionerWarning, match="murmur2"):
        GuardrailPublisher("127.0.0.1:1", generator_model="g", partitioner=first_partition)


async def test_calls_before_start_raise_and_nothing_is_queued() -> None:
    pub = GuardrailPublisher("127.0.0.1:1", generator_model="g")
    with pytest.raises(ClientNotStartedError):
        await pub.delta("r", "x")
    assert pub.stats.queued == 0


async def test_a_full_queue_drops_and_counts_instead_of_waiting(
    fake_producers: list[FakeProducer],
) -> None:
    pub = GuardrailPublisher("127.0.0.1:1", generator_model="g", max_queued_events=2)
    await pub.start()
    for i in range(5):  # no call yields to the loop: the send task has not run yet
        await pub.delta("r", str(i))
    assert (pub.stats.queued, pub.stats.dropped) == (2, 3)
    await pub.stop()
    assert pub.stats.delivered == 2


@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._:", min_size=1, max_size=64),
    st.integers(1, 64),
)
def test_partition_for_is_in_range_and_stable(request_id: str, partitions: int) -> None:
    p = partition_for(request_id, partitions)
    assert 0 <= p < partitions and p == partition_for(request_id, partitions)


def test_partition_for_matches_the_java_client() -> None:
    # Utils.toPositive(Utils.murmur2(key)) % n from org.apache.kafka.common.utils, as
    # published in Kafka's own UtilsTest ("21" -> -973932308, "foobar" -> -790332482)
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF  # aiokafka returns it unsigned
    assert murmur2(b"foobar") == -790332482 & 0xFFFFFFFF
    assert partition_for("foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7
    assert fast_murmur2(b"21") == murmur2(b"21") and fast_murmur2(b"foobar") == murmur2(b"foobar")


@given(st.binary(max_size=300))
def test_the_clients_murmur2_is_aiokafkas(data: bytes) -> None:
    # every length mod 4 (the tail bytes) and the empty key
    assert fast_murmur2(data) == murmur2(data)


def test_values_are_plain_json_objects() -> None:
    value = builder().retrieval("r", "q", HITS, tenant="t", collection="c").value
    assert orjson.loads(value)["schema_version"] == 1


def test_the_client_limits_default_to_the_sidecars() -> None:
    sidecar = LimitSettings()
    client = SidecarLimits()
    assert (client.max_hits, client.max_answer_chars, client.max_message_bytes) == (
        sidecar.max_hits,
        sidecar.max_answer_chars,
        sidecar.max_message_bytes,
    )
    assert client.max_deltas == MAX_DELTAS_PER_REQUEST


def test_events_the_sidecar_would_dead_letter_are_refused_at_the_call() -> None:
    """Sent, they would never be decided, and a caller failing open (the default) would show
    the answer unchecked; refused, the caller sees why. A refused delta takes no seq."""
    b = builder(limits=SidecarLimits(max_hits=2, max_answer_chars=10, max_message_bytes=600))
    with pytest.raises(InvalidEventError, match="3 hits"):
        b.retrieval("r1", "q", HITS * 3, tenant="t", collection="c")
    b.retrieval("r1", "q", HITS * 2, tenant="t", collection="c")
    with pytest.raises(InvalidEventError, match="more than 10"):
        b.final("r1", "x" * 11)
    assert decoded(InputKind.GENERATION, b.delta("r1", "abcdef").value).seq == 0
    with pytest.raises(InvalidEventError, match="would have 12 characters"):
        b.delta("r1", "ghijkl")
    assert decoded(InputKind.GENERATION, b.delta("r1", "ghij").value).seq == 1  # no gap
    assert decoded(InputKind.GENERATION, b.final("r1", "abcdefghij").value).deltas == 2
    tight = builder(limits=SidecarLimits(max_message_bytes=600))
    tight.final("r2", "x" * 100)
    with pytest.raises(InvalidEventError, match="bytes"):  # escapes: 6 bytes per character
        tight.final("r2b", "\x01" * 100)
    few = builder(limits=SidecarLimits(max_deltas=2))
    few.delta("r3", "a")
    few.delta("r3", "b")
    with pytest.raises(InvalidEventError, match="more than 2 deltas"):
        few.delta("r3", "c")


HIT = HITS[0]
MALFORMED_HITS: dict[str, Any] = {
    "score-not-a-number": [{**HIT, "score": "high"}],
    "hit-is-an-int": [7],
    "hit-is-none": [None],
    "hit-is-a-string": ["c1"],
    "hit-is-a-list-of-pairs": [list(HIT.items())],
    "chunk-id-is-a-list": [{**HIT, "chunk_id": ["c1"]}],
    "hits-are-none": None,
    "hits-are-one-mapping": HIT,
    "hits-are-a-string": "c1",
    "hits-are-a-set": {"c1"},
}


@pytest.mark.parametrize("hits", MALFORMED_HITS.values(), ids=MALFORMED_HITS.keys())
def test_malformed_hits_raise_invalid_event_error_naming_the_hits(hits: Any) -> None:
    """Before the fix a hit that is not a mapping (or hits that are not a sequence) raised a
    bare TypeError or ValueError from ``dict(hit)`` / ``len(hits)``."""
    with pytest.raises(InvalidEventError, match="hits") as caught:
        builder().retrieval("r", "q", hits, tenant="t", collection="c")
    assert caught.value.event_type == "retrieval"


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda b: b.delta(["r"], "x"), "request_id"),  # unhashable: was a bare TypeError
        (lambda b: b.delta({"r": 1}, "x"), "request_id"),
        (lambda b: b.final(["r"], "a"), "request_id"),
        (lambda b: b.final("r", None), "answer"),  # len(None): was a bare TypeError
        (lambda b: b.final("r", 5), "answer"),
        (lambda b: b.final("r", "a", attention=object()), "attention"),  # float(object())
    ],
)
def test_arguments_of_the_wrong_type_raise_invalid_event_error(call: Any, field: str) -> None:
    with pytest.raises(InvalidEventError) as caught:
        call(builder())
    assert field in caught.value.detail


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(object),
)
GOOD: dict[str, dict[str, Any]] = {
    "retrieval": {"request_id": "r", "query": "q", "hits": HITS, "tenant": "t", "collection": "c"},
    "delta": {"request_id": "r", "text": "x"},
    "final": {"request_id": "r", "answer": "a", "attention": None, "logprob": -0.5},
}


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@given(data=st.data(), method=st.sampled_from(sorted(GOOD)), junk=JUNK)
def test_any_bad_argument_or_hit_field_raises_invalid_event_error_only(
    data: st.DataObject, method: str, junk: Any
) -> None:
    """One argument (or one field of a hit, or a hit) replaced by junk: the call succeeds
    or raises ``InvalidEventError``, never anything else."""
    kwargs = dict(GOOD[method])
    target = data.draw(
        st.sampled_from([*kwargs, "hit", "hit field"] if method == "retrieval" else list(kwargs))
    )
    if target == "hit":
        kwargs["hits"] = [junk]
    elif target == "hit field":
        kwargs["hits"] = [{**HIT, data.draw(st.sampled_from(sorted(HIT))): junk}]
    else:
        kwargs[target] = junk
    try:
        getattr(builder(), method)(**kwargs)
    except InvalidEventError:
        pass
