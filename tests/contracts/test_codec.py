from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.contracts.codec import InputKind, decode_input, encode
from sidecar.contracts.events import AttentionSummary, GenerationFinal, RetrievalEvent
from sidecar.exceptions import InputError
from tests.conftest import EventFactory, dumps

LIMITS: dict[str, int] = {"max_bytes": 1_048_576, "max_depth": 32}


def reason_of(kind: InputKind, raw: bytes | None, **limits: int) -> str:
    with pytest.raises(InputError) as info:
        decode_input(kind, raw, **{**LIMITS, **limits})
    return info.value.reason


def test_valid_events_round_trip(
    retrieval_event: EventFactory, final_event: EventFactory, delta_event: EventFactory
) -> None:
    r = decode_input(InputKind.RETRIEVAL, dumps(retrieval_event()), **LIMITS)
    assert isinstance(r, RetrievalEvent)
    assert decode_input(InputKind.RETRIEVAL, encode(r), **LIMITS) == r
    f = decode_input(InputKind.GENERATION, dumps(final_event()), **LIMITS)
    assert isinstance(f, GenerationFinal)
    d = decode_input(InputKind.GENERATION, dumps(delta_event()), **LIMITS)
    assert d.event_type == "generation.delta"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "malformed-json"),
        (b"{", "malformed-json"),
        (b'{"a": NaN}', "malformed-json"),
        (b'{"score": 1e999}', "malformed-json"),
        (b"\xff\xfe{}", "invalid-utf8"),
        (b"[1, 2]", "not-an-object"),
        (b'"text"', "not-an-object"),
        (b"{}", "missing-schema-version"),
        (b'{"schema_version": 2}', "unknown-schema-version"),
        (b'{"schema_version": "1"}', "unknown-schema-version"),
        (b'{"schema_version": true}', "unknown-schema-version"),
        (b'{"schema_version": 1, "event_type": "generation.final"}', "wrong-event-type"),
        (b'{"schema_version": 1}', "wrong-event-type"),
        (b'{"schema_version": 1, "event_type": "retrieval"}', "schema-violation"),
        (b"[" * 5000 + b"]" * 5000, "too-deep"),
    ],
)
def test_bad_input_has_a_named_reason(raw: bytes | None, reason: str) -> None:
    assert reason_of(InputKind.RETRIEVAL, raw) == reason


def test_schema_registry_framing_is_read_as_the_json_it_frames(
    retrieval_event: EventFactory, final_event: EventFactory
) -> None:
    """Confluent's JSON Schema serializers write magic byte 0, a 4-byte schema id, then the
    JSON: such a producer's events are read (all of them went to the DLQ before)."""
    for kind, raw in (
        (InputKind.RETRIEVAL, dumps(retrieval_event())),
        (InputKind.GENERATION, dumps(final_event())),
    ):
        framed = b"\x00" + (100_042).to_bytes(4, "big") + raw
        assert decode_input(kind, framed, **LIMITS) == decode_input(kind, raw, **LIMITS)
    header = b"\x00\x00\x00\x00\x07"
    assert reason_of(InputKind.RETRIEVAL, header + b"{") == "malformed-json"
    assert reason_of(InputKind.RETRIEVAL, header + b"[1]") == "not-an-object"
    assert reason_of(InputKind.RETRIEVAL, header + b"\x00" + header + b"{}") == "malformed-json"
    with pytest.raises(InputError, match="Schema Registry's wire format"):
        decode_input(InputKind.RETRIEVAL, header, **LIMITS)
    # the size limit counts the whole value, framing included
    raw = dumps(retrieval_event())
    assert reason_of(InputKind.RETRIEVAL, header + raw, max_bytes=len(raw)) == "oversize"


def test_nesting_beyond_the_configured_depth_is_rejected(retrieval_event: EventFactory) -> None:
    nested: Any = "x"
    for _ in range(40):
        nested = {"n": nested}
    raw = dumps(retrieval_event(query=nested))
    assert reason_of(InputKind.RETRIEVAL, raw) == "too-deep"


def test_oversize_is_checked_before_parsing(retrieval_event: EventFactory) -> None:
    raw = dumps(retrieval_event(query="x" * 5000))
    assert reason_of(InputKind.RETRIEVAL, raw, max_bytes=4096) == "oversize"


@pytest.mark.parametrize(
    "override",
    [
        {"request_id": ""},
        {"request_id": "has space"},
        {"k": 0},
        {"k": 1},  # two hits but k=1
        {"hits": [{"chunk_id": "c", "doc_id": "d", "score": "high", "text": ""}]},
        {"tenant": 5},
        {"unexpected": "field"},
    ],
)
def test_schema_violations(retrieval_event: EventFactory, override: dict[str, Any]) -> None:
    assert reason_of(InputKind.RETRIEVAL, dumps(retrieval_event(**override))) == "schema-violation"


def test_attention_summary_shape_and_values_are_checked(final_event: EventFactory) -> None:
    ok = AttentionSummary.from_array(np.full((2, 3, 4), 0.5))
    event = final_event(attention=ok.model_dump())
    decoded = decode_input(InputKind.GENERATION, dumps(event), **LIMITS)
    assert isinstance(decoded, GenerationFinal)
    assert decoded.attention is not None
    np.testing.assert_allclose(decoded.attention.to_array(), 0.5)

    wrong_shape = {**ok.model_dump(), "chunks": 5}
    assert (
        reason_of(InputKind.GENERATION, dumps(final_event(attention=wrong_shape)))
        == "schema-violation"
    )
    nan = base64.b64encode(np.full(24, np.nan, dtype="<f2").tobytes()).decode()
    with_nan = {**ok.model_dump(), "values": nan}
    assert (
        reason_of(InputKind.GENERATION, dumps(final_event(attention=with_nan)))
        == "schema-violation"
    )
    not_b64 = {**ok.model_dump(), "values": "***"}
    assert (
        reason_of(InputKind.GENERATION, dumps(final_event(attention=not_b64))) == "schema-violation"
    )


def test_a_summary_keeps_its_decoded_values_without_a_post_init_callback() -> None:
    """The validator keeps the decoded values in a slot: no private attribute, whose set-up
    pydantic-core calls back after every validation (~2 us a summary). A summary built
    without validation, copied or unpickled decodes ``values`` again: the same bytes."""
    assert AttentionSummary.__pydantic_post_init__ is None
    ok = AttentionSummary.from_array(np.full((2, 3, 4), 0.5))
    expected = base64.b64decode(ok.values)
    assert ok.decoded() == expected and ok.decoded_bytes == 2 * 3 * 4 * 2
    built = AttentionSummary.model_construct(**ok.model_dump())
    assert built.decoded_bytes == 0 and built.decoded() == expected
    for other in (ok.model_copy(), pickle.loads(pickle.dumps(ok))):  # noqa: S301 - our own
        assert other == ok and other.decoded() == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_fuzz_arbitrary_bytes_only_ever_raise_input_error(raw: bytes) -> None:
    for kind in InputKind:
        try:
            decode_input(kind, raw, **LIMITS)
        except InputError as exc:
            assert exc.reason


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["schema_version", "event_type", "request_id", "hits", "k", "answer", "seq"]
        ),
        json_values,
    )
)
def test_fuzz_json_objects_only_ever_raise_input_error(obj: dict[str, Any]) -> None:
    raw = json.dumps(obj).encode()
    for kind in InputKind:
        try:
            decode_input(kind, raw, **LIMITS)
        except InputError as exc:
            assert exc.reason


def test_every_float16_bit_pattern_is_refused_exactly_when_nan_inf_or_negative() -> None:
    """The summary's value checks read bytes; they must agree with numpy on all 65,536.

    Accepted: every finite value >= 0, and -0.0 (lookback ratios are means of attention
    probabilities, eq. 8). Refused: NaN and +-Inf, and every value below zero.
    """
    patterns = np.arange(65_536, dtype="<u2")
    values = patterns.view("<f2")
    finite = np.isfinite(values)
    allowed = finite & (values >= 0)  # -0.0 >= 0 holds
    ok = patterns[allowed].tobytes()
    for start in range(0, len(ok), 2048):  # chunks <= 1024 columns per summary
        block = ok[start : start + 2048]
        AttentionSummary(
            layers=1, heads=1, chunks=len(block) // 2, values=base64.b64encode(block).decode()
        )
    assert int(allowed.sum()) == 0x7C00 + 1  # +0 .. max finite, and -0.0
    bad = patterns[~finite]
    assert len(bad) == 2 * 1024  # sign x mantissa with the exponent all ones: +-Inf and NaNs
    for value in bad.tolist():
        raw = int(value).to_bytes(2, "little")
        with pytest.raises(ValueError, match="NaN or Inf"):
            AttentionSummary(layers=1, heads=1, chunks=1, values=base64.b64encode(raw).decode())
    negative = patterns[finite & ~allowed]
    assert len(negative) == 0x7C00 - 1  # -max finite .. the smallest negative subnormal
    for value in negative.tolist():
        # the negative value among ordinary ones: one bad column refuses the summary
        raw = np.array([0.5, 0.0, 1.0], dtype="<f2").tobytes() + int(value).to_bytes(2, "little")
        with pytest.raises(ValueError, match="negative lookback ratio"):
            AttentionSummary(layers=1, heads=1, chunks=4, values=base64.b64encode(raw).decode())


@pytest.mark.parametrize(
    ("kind", "event"),
    [
        (InputKind.RETRIEVAL, {"event_type": "retrieval", "k": "2"}),
        (InputKind.RETRIEVAL, {"event_type": "retrieval", "k": True}),
        (InputKind.GENERATION, {"event_type": "generation.delta", "seq": "7"}),
        (InputKind.FEEDBACK, {"event_type": "feedback", "correct": "yes"}),
        (InputKind.FEEDBACK, {"event_type": "feedback", "correct": "off"}),
    ],
    ids=["k-string", "k-bool", "seq-string", "correct-yes", "correct-off"],
)
@pytest.mark.parametrize("path", ["fast", "checked"])
def test_values_the_published_schema_refuses_are_refused_on_both_paths(
    kind: InputKind, event: dict[str, Any], path: str
) -> None:
    """No lax coercion: "k": "2" or "correct": "yes" is a schema violation, as the JSON schema
    in schemas/ says, whether the record takes the fast path or the checked one (a \\u escape
    anywhere sends it there: json.dumps writes "é" as one)."""
    text = "caf\u00e9" if path == "checked" else "cafe"
    base: dict[str, dict[str, Any]] = {
        "retrieval": {
            "query": text,
            "tenant": "t",
            "collection": "c",
            "k": 2,
            "hits": [{"chunk_id": "c1", "doc_id": "d", "score": 0.5, "text": "x"}],
        },
        "generation.delta": {"seq": 0, "text": text},
        "feedback": {"correct": True, "source": text},
    }
    good = {"schema_version": 1, "request_id": "r1", **base[event["event_type"]], **event}
    good.update({k: v for k, v in base[event["event_type"]].items() if k in event})
    raw_good = json.dumps(good).encode()
    assert (b"\\u00e9" in raw_good) == (path == "checked")
    decode_input(kind, raw_good, **LIMITS)
    with pytest.raises(InputError) as info:
        decode_input(kind, json.dumps({**good, **event}).encode(), **LIMITS)
    assert info.value.reason == "schema-violation"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("collection", "docs\x1b[2J\x1b[31m"),  # an ANSI escape: clears the operator's terminal
        ("tenant", "acme\nlevel=ERROR forged log line"),
        ("retriever", "bm25\u202egnp.exe"),  # a bidirectional override
        ("tenant", "t\x00"),
        ("collection", "c\x85"),  # a C1 control (NEL)
    ],
)
@pytest.mark.parametrize("escaped", [True, False], ids=["json-escape", "raw-utf8"])
def test_control_characters_in_label_names_are_schema_violations(
    retrieval_event: EventFactory, field: str, value: str, escaped: bool
) -> None:
    """Tenant, collection and retriever key calibrations and label metrics and spans:
    control characters, line separators and bidi overrides are refused on both decode
    paths (an escape in the JSON sends the record down the checked path; raw UTF-8 takes
    the fast one where it can). Printable names in any script stay valid."""
    event = retrieval_event(**{field: value})
    raw = json.dumps(event, ensure_ascii=escaped).encode()
    with pytest.raises(InputError) as info:
        decode_input(InputKind.RETRIEVAL, raw, **LIMITS)
    assert info.value.reason == "schema-violation"
    assert str(info.value) == f"{field}: no control characters, line separators or " + (
        "bidirectional overrides"
    )
    fine = {**event, field: "Dokumente 文档 · ü"}
    decode_input(InputKind.RETRIEVAL, json.dumps(fine, ensure_ascii=escaped).encode(), **LIMITS)


def test_ids_that_only_reach_json_may_hold_a_bidi_mark(retrieval_event: EventFactory) -> None:
    """A doc_id copied from a right-to-left document (U+202B ... U+202C) is not a label: the
    request keeps its verdict (review of the first rule, which refused every name)."""
    hit = {
        "chunk_id": "c\u202b1\u202c",
        "doc_id": "d\u202b\u05e2\u05d1\u05e8\u05d9\u05ea\u202c",
        "score": 0.5,
        "text": "x",
    }
    event = retrieval_event(k=1, hits=[hit])
    decoded = decode_input(InputKind.RETRIEVAL, json.dumps(event).encode(), **LIMITS)
    assert isinstance(decoded, RetrievalEvent)
    assert decoded.hits[0].doc_id == "d\u202b\u05e2\u05d1\u05e8\u05d9\u05ea\u202c"
