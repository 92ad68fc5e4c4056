"""Dead letters: the original bytes plus ``x-dlq-*`` headers, cut down to fit the DLQ topic.

Header values are bytes from end to end: a dead letter carries the original
headers byte for byte (never decoded and re-encoded, which would turn one
invalid byte into three), and a dead letter that would not fit into its topic is
cut down by ``fit_dead_letter`` instead of being retried forever. Pure: the
time of failure is passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

from sidecar import __version__
from sidecar.contracts.codec import request_id_hint
from sidecar.contracts.events import DLQ_HEADER_PREFIX, DeadLetterRecord, dlq_header
from sidecar.exceptions import InputError, RecordTooLargeError
from sidecar.pipeline.join import REROUTED_HEADER, InputRef
from sidecar.pipeline.outputs import Destination, Header, Output

# kept first when a dead letter's headers are cut (its trace goes on)
_TRACE_FIRST = frozenset({"traceparent", "tracestate"})

__all__ = [
    "BATCH_OVERHEAD_BYTES",
    "dead_letter_output",
    "fit_dead_letter",
    "record_size",
    "reroute_refused_output",
    "undeliverable_output",
]

MAX_DLQ_DETAIL_CHARS = 2_000
MAX_DLQ_KEY_BYTES = 1_024  # a truncated dead letter keeps at most this much of its key
MAX_DLQ_NOTE_BYTES = 256  # x-dlq-truncated-reason
MAX_DLQ_DROPPED_BYTES = 128  # x-dlq-dropped-headers (the names, comma-separated)
# Kafka's record batch v2 framing: a 61-byte batch header; per record at most 36 bytes of
# varints and attributes; per header at most 10 bytes of length varints (KIP-98 format).
BATCH_OVERHEAD_BYTES = 61
RECORD_OVERHEAD_BYTES = 36
HEADER_OVERHEAD_BYTES = 10


def dead_letter_output(
    raw: bytes | None,
    key: bytes | None,
    ref: InputRef,
    error: InputError,
    *,
    failed_at: datetime,
) -> Output:
    """The original bytes, key and headers, plus ``x-dlq-*`` headers naming the reason."""
    record = DeadLetterRecord(
        reason=error.reason,
        detail=error.detail[:MAX_DLQ_DETAIL_CHARS],
        source_topic=ref.topic,
        source_partition=ref.partition,
        source_offset=ref.offset,
        request_id=error.request_id[:128] if error.request_id else request_id_hint(raw, key),
        failed_at=failed_at,
        sidecar_version=__version__,
    )
    # an input's own x-dlq-* headers (in any case: X-DLQ-Reason) would read as ours
    headers = [
        (name, value)
        for name, value in ref.headers
        if not name.lower().startswith(DLQ_HEADER_PREFIX)
    ]
    headers.extend(record.to_headers())
    return Output(destination=Destination.DLQ, key=key, value=raw or b"", headers=headers)


def reroute_refused_output(out: Output, error: InputError, *, failed_at: datetime) -> Output:
    """A rerouted record (``outputs.rerouted_output``) its topic refused for good, as the dead
    letter of the record it was made of: its topic, partition and offset (from the
    ``REROUTED_HEADER`` that was added last), its bytes and headers without that header, so
    that ``guardrail dlq redrive`` sends it keyed to its request's partition."""
    headers = out.headers
    ref = InputRef("?", -1, -1, tuple(headers))
    if headers and headers[-1][0] == REROUTED_HEADER:
        topic, _, place = headers[-1][1].decode("utf-8", "replace").partition("/")
        partition, _, offset = place.partition("/")
        if partition.lstrip("-").isdigit() and offset.isdigit():
            ref = InputRef(topic, int(partition), int(offset), tuple(headers[:-1]))
    error.request_id = error.request_id or (out.key or b"").decode("utf-8", "replace")
    return dead_letter_output(out.value, out.key, ref, error, failed_at=failed_at)


def undeliverable_output(
    out: Output, topic: str, error: InputError, *, failed_at: datetime
) -> Output:
    """A dead letter for an output that its own topic refused for good (too large).

    ``source_topic`` is the topic the output was meant for; partition and offset
    are -1 (it never had any). The output's own headers travel along.
    """
    record = DeadLetterRecord(
        reason=error.reason,
        detail=error.detail[:MAX_DLQ_DETAIL_CHARS],
        source_topic=topic,
        source_partition=-1,
        source_offset=-1,
        request_id=out.key.decode("utf-8", errors="replace")[:256] if out.key else None,
        failed_at=failed_at,
        sidecar_version=__version__,
    )
    headers = [(k, v) for k, v in out.headers if not k.startswith(DLQ_HEADER_PREFIX)]
    headers.extend(record.to_headers())
    return Output(destination=Destination.DLQ, key=out.key, value=out.value, headers=headers)


def record_size(key: bytes | None, value: bytes, headers: Sequence[Header]) -> int:
    """An upper bound of the bytes a record takes in a record batch of its own.

    The broker compares a batch's size with the topic's ``max.message.bytes``; a
    record over the producer's batch size is always sent in a batch of its own.
    """
    return (
        BATCH_OVERHEAD_BYTES
        + RECORD_OVERHEAD_BYTES
        + len(key or b"")
        + len(value)
        + sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in headers)
    )


def fit_dead_letter(out: Output, max_bytes: int, why: str) -> Output:
    """``out`` itself when it fits into ``max_bytes``, else a truncated copy that does.

    The truncated copy keeps its ``x-dlq-*`` headers (the detail cut if need be),
    the key (up to ``MAX_DLQ_KEY_BYTES``), the original headers that fit into half
    of what is left (whole, in order, the W3C trace headers chosen first so that
    junk before them cannot push them out; the others are named in
    ``x-dlq-dropped-headers``, with how many did not fit the list) and the first
    bytes of the value; it adds
    ``x-dlq-truncated: true``, ``x-dlq-original-size``, ``x-dlq-original-sha256``
    and ``x-dlq-truncated-reason`` (``why``). Raises ``RecordTooLargeError`` when not
    even the ``x-dlq-*`` headers fit (a DLQ limit far below any sane setting).
    """
    if record_size(out.key, out.value, out.headers) <= max_bytes:
        return out
    key = out.key[:MAX_DLQ_KEY_BYTES] if out.key is not None else None
    own = [(k, v) for k, v in out.headers if k.startswith(DLQ_HEADER_PREFIX)]
    original = [(k, v) for k, v in out.headers if not k.startswith(DLQ_HEADER_PREFIX)]
    marks = [
        (dlq_header("truncated"), b"true"),
        (dlq_header("original_size"), str(len(out.value)).encode("ascii")),
        (dlq_header("original_sha256"), hashlib.sha256(out.value).hexdigest().encode("ascii")),
        (dlq_header("truncated_reason"), _note(why, MAX_DLQ_NOTE_BYTES)),
    ]
    dropped_name = dlq_header("dropped_headers")
    reserve = HEADER_OVERHEAD_BYTES + len(dropped_name) + MAX_DLQ_DROPPED_BYTES
    own = _fit_detail(own, max_bytes - reserve - record_size(key, b"", marks), out)
    fixed = record_size(key, b"", own + marks) + reserve
    header_budget = (max_bytes - fixed) // 2
    keep: set[int] = set()
    for i in sorted(range(len(original)), key=lambda i: original[i][0] not in _TRACE_FIRST):
        name, value = original[i]
        cost = HEADER_OVERHEAD_BYTES + len(name.encode("utf-8")) + len(value)
        if cost <= header_budget:
            keep.add(i)
            header_budget -= cost
    kept = [h for i, h in enumerate(original) if i in keep]
    dropped = [h[0] for i, h in enumerate(original) if i not in keep]
    if dropped:
        marks.append((dropped_name, _names(dropped, MAX_DLQ_DROPPED_BYTES)))
    headers = kept + own + marks
    room = max_bytes - record_size(key, b"", headers)
    return Output(
        destination=out.destination,
        key=key,
        value=out.value[: max(0, room)],
        headers=headers,
        trace=out.trace,
    )


def _names(names: Sequence[str], limit: int) -> bytes:
    """``names`` comma-separated within ``limit`` bytes; when not all fit, the list ends
    with ``+N`` (how many more were dropped)."""
    whole = ",".join(names).encode("utf-8")
    if len(whole) <= limit:
        return whole
    listed: list[str] = []
    for k, name in enumerate(names):
        if len(",".join([*listed, name, f"+{len(names) - k - 1}"]).encode("utf-8")) > limit:
            break
        listed.append(name)
    return _note(",".join([*listed, f"+{len(names) - len(listed)}"]), limit)


def _note(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, at most ``limit`` bytes, never ending in half a character."""
    return _utf8_prefix(text.encode("utf-8"), limit)


def _utf8_prefix(value: bytes, size: int) -> bytes:
    """At most ``size`` bytes of UTF-8 ``value``, never ending inside a character (a detail
    quoting non-ASCII input, cut by bytes, was no longer UTF-8: audit)."""
    if size <= 0:
        return b""
    return value[:size].decode("utf-8", errors="ignore").encode("utf-8")


def _fit_detail(own: list[Header], budget: int, out: Output) -> list[Header]:
    """The ``x-dlq-*`` headers within ``budget`` bytes, cutting ``x-dlq-detail`` if need be."""
    size = sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in own)
    if size <= budget:
        return own
    detail = dlq_header("detail")
    excess = size - budget
    cut = [(k, _utf8_prefix(v, len(v) - excess) if k == detail else v) for k, v in own]
    if sum(HEADER_OVERHEAD_BYTES + len(k.encode("utf-8")) + len(v) for k, v in cut) > budget:
        raise RecordTooLargeError(
            str(out.destination),
            f"not even the dead letter's own x-dlq-* headers fit into {budget} bytes",
        )
    return cut
