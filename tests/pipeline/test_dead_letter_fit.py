"""Dead letters that fit their topic: the truncation builder at, below and above the limit."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import Settings
from sidecar.contracts.codec import InputKind
from sidecar.contracts.events import DeadLetterRecord
from sidecar.exceptions import InputError, RecordTooLargeError
from sidecar.pipeline.deadletters import (
    BATCH_OVERHEAD_BYTES,
    dead_letter_output,
    fit_dead_letter,
    record_size,
)
from sidecar.pipeline.join import InputRef
from sidecar.pipeline.outputs import Destination, Output
from sidecar.pipeline.processor import Processor
from sidecar.policy import PlaceholderPolicy

LIMIT = 8_192
FAILED_AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
BINARY = b"\xff\xfe\x00\xc3("


def dead_letter(value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Output:
    ref = InputRef(topic="rag.generation", partition=2, offset=41, headers=headers)
    error = InputError("malformed-json", "not valid JSON: unexpected end of data")
    return dead_letter_output(value, b"req-7", ref, error, failed_at=FAILED_AT)


def sized(total: int, headers: tuple[tuple[str, bytes], ...] = ()) -> Output:
    """A dead letter whose ``record_size`` is exactly ``total``."""
    skeleton = dead_letter(b"", headers)
    out = dead_letter(b"v" * (total - record_size(skeleton.key, b"", skeleton.headers)), headers)
    assert record_size(out.key, out.value, out.headers) == total
    return out


@pytest.mark.parametrize("delta", [-1, 0])
def test_a_dead_letter_at_or_below_the_limit_is_untouched(delta: int) -> None:
    out = sized(LIMIT + delta, (("traceparent", b"00-abc"), ("x-binary", BINARY)))
    assert fit_dead_letter(out, LIMIT, "why") is out


def test_one_byte_over_the_limit_is_truncated_and_says_so() -> None:
    headers = (("traceparent", b"00-abc"), ("x-binary", BINARY))
    out = sized(LIMIT + 1, headers)
    fitted = fit_dead_letter(out, LIMIT, "8193 bytes exceed the 8192-byte limit")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= LIMIT
    assert out.value.startswith(fitted.value)
    assert len(fitted.value) < len(out.value)
    assert fitted.key == out.key
    assert fitted.destination is Destination.DLQ
    record = DeadLetterRecord.from_headers(fitted.headers)
    assert record.truncated is True
    assert record.original_size == len(out.value)
    assert record.original_sha256 == hashlib.sha256(out.value).hexdigest()
    assert record.truncated_reason == "8193 bytes exceed the 8192-byte limit"
    assert record.reason == "malformed-json"
    assert record.source_offset == 41
    assert record.dropped_headers is None
    # the original headers, byte for byte, first and in order
    assert fitted.headers[:2] == list(headers)
    assert fitted.header("x-dlq-truncated") == b"true"


def test_a_header_too_large_for_the_budget_is_dropped_and_named() -> None:
    blob = b"\xff" * (2 * LIMIT)
    out = dead_letter(b'{"a": ', (("traceparent", b"00-abc"), ("x-blob", blob), ("k", b"v")))
    fitted = fit_dead_letter(out, LIMIT, "too large")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= LIMIT
    assert fitted.header("x-blob") is None
    assert fitted.header("traceparent") == b"00-abc"
    assert fitted.header("k") == b"v"  # the headers after a dropped one still get their turn
    assert fitted.value == b'{"a": '  # the value was small: kept whole
    assert DeadLetterRecord.from_headers(fitted.headers).dropped_headers == "x-blob"


def test_a_limit_below_the_dead_letters_own_headers_cuts_the_detail_then_gives_up() -> None:
    long_detail = InputError("malformed-json", "d" * 2_000)
    ref = InputRef(topic="rag.generation", partition=0, offset=1)
    out = dead_letter_output(b"x" * 4_000, b"k", ref, long_detail, failed_at=FAILED_AT)
    fitted = fit_dead_letter(out, 1_024, "small topic")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= 1_024
    detail = fitted.header("x-dlq-detail")
    assert detail is not None and 0 < len(detail) < 2_000
    with pytest.raises(RecordTooLargeError) as caught:
        fit_dead_letter(out, 200, "absurd topic")
    assert caught.value.dead_letter and not caught.value.retriable


@pytest.mark.parametrize("limit", range(1_000, 1_012))
def test_a_cut_detail_is_still_utf8(limit: int) -> None:
    """Audit: the detail was cut by bytes, and could end inside a character it quoted."""
    quoted = InputError("malformed-json", "unexpected text: " + "\u00e9\u6771\U0001f600" * 300)
    ref = InputRef(topic="rag.generation", partition=0, offset=1)
    out = dead_letter_output(b"x" * 4_000, b"k", ref, quoted, failed_at=FAILED_AT)
    fitted = fit_dead_letter(out, limit, "small topic")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= limit
    detail = fitted.header("x-dlq-detail")
    assert detail is not None and detail.startswith(b"unexpected text: ")
    assert str(quoted).startswith(detail.decode("utf-8"))  # strict: raises if cut inside


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    value=st.binary(max_size=20_000),
    headers=st.lists(
        st.tuples(st.text(min_size=1, max_size=20), st.binary(max_size=6_000)), max_size=6
    ),
    limit=st.integers(min_value=1_024, max_value=24_000),
)
def test_a_fitted_dead_letter_never_exceeds_the_limit(
    value: bytes, headers: list[tuple[str, bytes]], limit: int
) -> None:
    out = dead_letter(value, tuple(headers))
    fitted = fit_dead_letter(out, limit, "property")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= limit
    assert out.value.startswith(fitted.value)
    assert fitted.header("x-dlq-reason") == b"malformed-json"
    kept = [h for h in fitted.headers if not h[0].startswith("x-dlq-")]
    assert all(h in headers for h in kept)  # original headers are kept whole or not at all
    if fitted is not out:
        assert fitted.header("x-dlq-original-size") == str(len(value)).encode()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    key=st.none() | st.binary(max_size=300),
    value=st.binary(max_size=70_000),
    headers=st.lists(st.tuples(st.text(max_size=30), st.binary(max_size=3_000)), max_size=8),
)
def test_record_size_bounds_aiokafkas_own_estimate(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]
) -> None:
    """The broker sees a batch; aiokafka estimates it; ours is never below that estimate."""
    estimate = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
    assert estimate <= record_size(key, value, headers)
    assert record_size(key, value, headers) - estimate <= BATCH_OVERHEAD_BYTES + 10 * (
        len(headers) + 4
    )


def test_junk_headers_before_the_trace_headers_cannot_push_them_out() -> None:
    """10,000 small headers ahead of traceparent: the trace goes on in the dead letter, and
    the list of dropped names ends with how many more there were."""
    junk = tuple((f"h{i:05d}", b"v" * 10) for i in range(10_000))
    trace = (
        ("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"),
        ("tracestate", b"k=v"),
    )
    out = dead_letter(b"{broken", (*junk, ("x-big", b"x" * 900_000), *trace))
    fitted = fit_dead_letter(out, 65_536, "too large for the DLQ")
    assert record_size(fitted.key, fitted.value, fitted.headers) <= 65_536
    names = [k for k, _ in fitted.headers]
    assert "traceparent" in names and "tracestate" in names
    kept = [k for k in names if k.startswith("h")]
    assert kept == sorted(kept) and kept[0] == "h00000"  # the rest kept in order
    dropped = fitted.header("x-dlq-dropped-headers")
    assert dropped is not None and len(dropped) <= 128
    listed = dropped.decode().split(",")
    more = int(listed[-1].lstrip("+"))
    assert listed[-1].startswith("+") and len(listed) - 1 + more == 10_001 - len(kept)


@pytest.mark.parametrize(
    ("key", "named"),
    [
        (b"req-42", "req-42"),
        (b"evil\r\n\x1b[31mkey\x00", None),  # audit: went verbatim into the header
        (b"caf\xc3\xa9", None),  # not a request id's characters
        (b"r" * 129, None),  # longer than any request id
        (None, None),
    ],
)
def test_a_dead_letter_names_the_key_as_its_request_only_when_it_could_be_one(
    key: bytes | None, named: str | None
) -> None:
    processor = Processor(Settings.load(), PlaceholderPolicy())
    step = processor.on_message(InputKind.RETRIEVAL, b"{not json", key, InputRef("r", 0, 7), 0)
    [out] = step.outputs
    headers = dict(out.headers)
    assert headers.get("x-dlq-request-id") == (named.encode() if named else None)
    assert out.key == key  # the original key travels as the record's key
