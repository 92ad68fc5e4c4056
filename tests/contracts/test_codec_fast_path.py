"""The decoder's fast path (pydantic JSON mode) answers exactly as the checked path.

``decode_input`` tries the bytes in JSON mode first and falls back to the
checked path (orjson, envelope checks, the model); these tests hold the two
equal — the same event, or the same dead-letter reason — on valid events,
their known traps (``schema_version`` spelt ``1.0`` or ``true`` or missing,
duplicate keys, integers beyond 64 bits, escapes) and random mutations.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.contracts import codec
from sidecar.contracts.codec import InputKind, decode_checked, decode_input, encode
from sidecar.contracts.events import AnswerVerdict, AttentionSummary, Decision, Reason
from sidecar.exceptions import InputError

MAX_DEPTH = 32


def _outcome(kind: InputKind, raw: bytes, decode: Any) -> tuple[str, Any]:
    try:
        return "event", decode(kind, raw)
    except InputError as exc:
        return "dead-letter", exc.reason


def fast(kind: InputKind, raw: bytes) -> tuple[str, Any]:
    return _outcome(
        kind, raw, lambda k, r: decode_input(k, r, max_bytes=10**7, max_depth=MAX_DEPTH)
    )


def checked(kind: InputKind, raw: bytes) -> tuple[str, Any]:
    return _outcome(kind, raw, lambda k, r: decode_checked(k, r, max_depth=MAX_DEPTH))


def _retrieval() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_type": "retrieval",
        "request_id": "r-1",
        "tenant": "acme",
        "collection": "wiki",
        "query": "who?",
        "k": 2,
        "hits": [
            {"chunk_id": "c1", "doc_id": "d1", "score": 0.8, "text": "alpha"},
            {"chunk_id": "c2", "doc_id": "d2", "score": 0.5, "text": "beta"},
        ],
        "created_at": "2024-05-01T12:00:00Z",
    }


def _final() -> dict[str, Any]:
    attention = AttentionSummary.from_array([[[0.25, 0.5]]]).model_dump()
    return {
        "schema_version": 1,
        "event_type": "generation.final",
        "request_id": "r-1",
        "answer": "It is alpha.",
        "generator_model": "m",
        "deltas": 2,
        "attention": attention,
        "mean_token_logprob": -0.5,
    }


def _delta() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_type": "generation.delta",
        "request_id": "r-1",
        "seq": 0,
        "text": "It",
    }


def _feedback() -> dict[str, Any]:
    return {
        "schema_version": 1,
        "event_type": "feedback",
        "request_id": "r-1",
        "correct": True,
        "source": "user",
    }


CASES = [
    (InputKind.RETRIEVAL, _retrieval),
    (InputKind.GENERATION, _final),
    (InputKind.GENERATION, _delta),
    (InputKind.FEEDBACK, _feedback),
]


@pytest.mark.parametrize(("kind", "make"), CASES)
def test_valid_events_take_the_fast_path_and_decode_the_same(
    kind: InputKind, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = orjson.dumps(make())
    assert codec._fast_path_safe(raw, MAX_DEPTH)
    want = checked(kind, raw)
    with monkeypatch.context() as patched:  # the fast path's validator answers on its own

        def no_fallback(*_: Any, **__: Any) -> Any:
            raise AssertionError("a valid event fell back to the checked path")

        patched.setattr(codec, "decode_checked", no_fallback)
        got = fast(kind, raw)
    assert got[0] == "event" and got == want
    assert type(got[1]) is type(want[1])


def _spliced(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert old in raw
    return raw.replace(old, new, 1)


DELTA = orjson.dumps(_delta())
TRAPS = [
    ("version 1.0", _spliced(DELTA, b'"schema_version":1', b'"schema_version":1.0')),
    ("version true", _spliced(DELTA, b'"schema_version":1', b'"schema_version":true')),
    ("version 1e0", _spliced(DELTA, b'"schema_version":1', b'"schema_version":1e0')),
    ("version missing", _spliced(DELTA, b'"schema_version":1,', b"")),
    ("version twice, last true", DELTA[:-1] + b',"schema_version":true}'),
    ("version key escaped", _spliced(DELTA, b'"schema_version"', b'"schema_versio\\u006e"')),
    (
        "version again, escaped",
        DELTA[:-1] + b',"schema_versio\\u006e":true}',
    ),
    ("seq 2**64", _spliced(DELTA, b'"seq":0', b'"seq":18446744073709551616')),
    (
        "deltas 2**64 + 1 (orjson: a float)",
        _spliced(orjson.dumps(_final()), b'"deltas":2', b'"deltas":18446744073709551617'),
    ),
    (
        "score a 400-digit integer",
        _spliced(orjson.dumps(_retrieval()), b'"score":0.8', b'"score":' + b"9" * 400),
    ),
    (
        "logprob minus a 400-digit integer",
        _spliced(
            orjson.dumps(_final()),
            b'"mean_token_logprob":-0.5',
            b'"mean_token_logprob":-' + b"9" * 400,
        ),
    ),
    ("seq 1e400", _spliced(DELTA, b'"seq":0', b'"seq":1e400')),
    ("seq 0.0", _spliced(DELTA, b'"seq":0', b'"seq":0.0')),
    ("seq true", _spliced(DELTA, b'"seq":0', b'"seq":true')),
    ("seq NaN", _spliced(DELTA, b'"seq":0', b'"seq":NaN')),
    ("lone surrogate", _spliced(DELTA, b'"text":"It"', b'"text":"\\ud800"')),
    ("surrogate pair", _spliced(DELTA, b'"text":"It"', b'"text":"\\ud83d\\ude00"')),
    ("text twice", DELTA[:-1] + b',"text":"again"}'),
    ("bom", b"\xef\xbb\xbf" + DELTA),
    ("trailing garbage", DELTA + b" x"),
    ("trailing space", DELTA + b" \n"),
    ("spaces", DELTA.replace(b":", b" : ").replace(b",", b" , ")),
    ("not utf-8", _spliced(DELTA, b"It", b"I\xff")),
    ("wrong event type", _spliced(DELTA, b"generation.delta", b"retrieval")),
    ("extra field", DELTA[:-1] + b',"extra":1}'),
    ("not an object", b"[1,2]"),
]


@pytest.mark.parametrize(("name", "raw"), TRAPS, ids=[name for name, _ in TRAPS])
def test_traps_get_the_checked_paths_answer(name: str, raw: bytes) -> None:
    for kind in InputKind:
        assert fast(kind, raw) == checked(kind, raw), (name, kind)


def test_a_depth_limit_below_the_models_nesting_is_still_enforced() -> None:
    raw = orjson.dumps(_retrieval())
    for depth in (1, 2, 3):
        got = _outcome(
            InputKind.RETRIEVAL,
            raw,
            lambda k, r, d=depth: decode_input(k, r, max_bytes=10**7, max_depth=d),
        )
        want = _outcome(
            InputKind.RETRIEVAL, raw, lambda k, r, d=depth: decode_checked(k, r, max_depth=d)
        )
        assert got == want


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(case=st.sampled_from(CASES), field=st.text(max_size=20), value=_json, drop=st.booleans())
def test_mutated_events_decode_the_same_on_both_paths(
    case: tuple[InputKind, Any], field: str, value: Any, drop: bool
) -> None:
    """One field replaced, added or dropped (nested ones too): the same outcome."""
    kind, make = case
    event = make()
    names = sorted(event)
    target = names[len(field) % len(names)] if field == "" or field in event else field
    if drop:
        event.pop(target, None)
    else:
        event[target] = value
    if "hits" in event and isinstance(event["hits"], list) and event["hits"]:
        hit = event["hits"][0]
        if isinstance(hit, dict) and not drop:
            hit[field or "score"] = value
    # the stdlib writes integers beyond 64 bits as numbers (orjson refuses them)
    raw = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
    assert fast(kind, raw) == checked(kind, raw)


def _safe_as_first_written(raw: bytes, max_depth: int) -> bool:
    """``_fast_path_safe`` as it was first written: a count and a regular expression search."""
    return (
        max_depth >= codec.MODEL_DEPTH
        and (b"\\" not in raw or b"\\u" not in raw)
        and raw.count(b'"schema_version"') == 1
        and re.search(rb'"schema_version"\s*:\s*1\s*[,}]', raw) is not None
    )


_PIECES = [b'"schema_version"', b":", b" ", b"1", b"1.0", b"true", b",", b"}", b"{", b"\\"]
_PIECES += [b"u", b'"', b"x", b'"seq":0', b"\n"]


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(pieces=st.lists(st.sampled_from(_PIECES), max_size=12), depth=st.integers(1, 4))
def test_the_fast_path_check_answers_as_first_written(pieces: list[bytes], depth: int) -> None:
    """The byte scans (``find``, ``startswith``) say what the count and the search said;
    the one input they may refuse besides, which cannot parse as JSON, goes to the
    checked path (it decides every input the check refuses)."""
    raw = b"".join(pieces)
    if b'"schema_version"schema_version"' in raw:  # a key overlapping a copy of itself
        assert codec._fast_path_safe(raw, depth) <= _safe_as_first_written(raw, depth)
    else:
        assert codec._fast_path_safe(raw, depth) == _safe_as_first_written(raw, depth)
    for version in (b"1", b" 1 ", b"1.0"):  # and the envelope spelt as serialisers write it
        for end in (b",", b"}", b" }"):
            event = b'{"schema_version":' + version + end + raw
            assert codec._fast_path_safe(event, 3) == _safe_as_first_written(event, 3)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    confidence=st.none() | st.floats(min_value=0.0, max_value=1.0),
    feature=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    text=st.text(max_size=30),
    when=st.datetimes(timezones=st.just(UTC)),
)
def test_encode_writes_the_bytes_the_dict_route_wrote(
    confidence: float | None, feature: float | None, text: str, when: datetime
) -> None:
    """One pass through pydantic's serializer: byte for byte what orjson wrote from the dict."""
    verdict = AnswerVerdict(
        request_id="r-1",
        idempotency_key="k",
        decision=Decision.CAVEAT,
        reasons=[Reason(code="x.y", message=text)],
        policy="p/1",
        confidence=confidence,
        confidence_features={"f": feature, "g": None},
        caveat_text=text,
        produced_at=when,
        sidecar_version="0",
    )
    assert encode(verdict) == orjson.dumps(verdict.model_dump(mode="json"))
