"""Record batches a consumer can always read: header names that are not UTF-8, and
compressed batches, inflated within a bound (moved from sidecar.kafka.records).

A header *name* is a protocol String, but the broker does not check it, and a Go
or C producer can send any bytes. aiokafka decodes names strictly while it
unpacks a fetch, so one name that is not UTF-8 raises ``UnicodeDecodeError`` out
of every ``getmany``. :func:`install_lenient_header_names` makes the fetcher read
such a batch again with the pure-Python reader, decoding names as Java's consumer
does (an invalid byte becomes U+FFFD). Both the sidecar's consumer and
``VerdictClient``'s install it; it lives here because the client imports no
``sidecar.kafka`` module.

A compressed batch is inflated by :mod:`guardrail_client.inflate` (streamed, at most
``max_batch_inflated_bytes``, any of Kafka's codecs) and read by the same fast reader,
uncompressed. When it cannot be read whole (past the bound, a corrupt stream, a codec
without its library), the records that came out whole are read and one record stands
in for the rest: no value, the header :data:`~guardrail_client.inflate.UNREAD_HEADER`
holding ``<reason>: <detail>``, at the batch's last offset (a consumer dead-letters it
and moves past the batch). Nothing is inflated without bound, and nothing raises out
of the fetch.
"""

from __future__ import annotations

import contextvars
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record import default_records, memory_records
from aiokafka.record.util import decode_varint

from guardrail_client.inflate import CODEC_NAMES, UNREAD_HEADER, inflate

__all__ = [
    "DEFAULT_MAX_BATCH_INFLATED_BYTES",
    "DEFAULT_MAX_POLL_BYTES",
    "MAX_RECORD_HEADERS",
    "LenientMemoryRecords",
    "install_lenient_header_names",
    "record_bytes",
]

log = logging.getLogger("guardrail_client")

DEFAULT_MAX_BATCH_INFLATED_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_POLL_BYTES = 4 * 1024 * 1024
_limits = {"batch": DEFAULT_MAX_BATCH_INFLATED_BYTES, "poll": DEFAULT_MAX_POLL_BYTES}
_RECORD_BYTES = 64  # what a record costs beyond its key and value (offset, fields)
# what a header costs in memory beyond its name and value (a tuple, a str, a bytes): an
# empty header is 2 bytes in Kafka and ~140 in Python, so headers are counted, not only
# their bytes
_HEADER_BYTES = 128
# headers read per record: a record with more is handed over with its value and one header
# that says so (the sidecar dead-letters it, ``too-many-headers``); 2 bytes a header, a
# 16 MiB record held 8 million, ~2.7 GB once read
MAX_RECORD_HEADERS = 1024
# a batch this small holds at most ~32,000 headers (~11 MB read): read as it is; a larger
# one is scanned for a record over MAX_RECORD_HEADERS first (record lengths, ~0.3 us each)
_SCAN_ABOVE = 64 * 1024
# the record bytes one poll (``getmany``) has taken so far; None outside one
_poll_spent: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "guardrail_poll_spent", default=None
)
_original_getall = fetcher.FetchResult.getall
_original_fetched_records = fetcher.Fetcher.fetched_records
_HEADER = default_records.DefaultRecordBase.HEADER_STRUCT
_ATTRIBUTES_AT = default_records.DefaultRecordBase.ATTRIBUTES_OFFSET
_CODEC_MASK = default_records.DefaultRecordBase.CODEC_MASK


class _Text(bytearray):
    """A header name's bytes: ``decode`` replaces what is not UTF-8 (as Java's consumer)."""

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        del errors
        return super().decode(encoding, "replace")


class _LenientBuffer(bytearray):
    """A record batch's bytes whose slices are :class:`_Text` (the reader decodes header
    names from slices; integers, struct reads and ``bytes(...)`` copies are unchanged)."""

    def __getitem__(self, index: Any) -> Any:
        item = super().__getitem__(index)
        return _Text(item) if isinstance(index, slice) else item


class _LenientBatch(default_records._DefaultRecordBatchPy):  # type: ignore[misc]
    """aiokafka's pure-Python batch reader over a :class:`_LenientBuffer`."""

    _buffer: bytearray  # a _LenientBuffer once set here

    def __init__(self, buffer: bytes) -> None:
        super().__init__(buffer)
        self._buffer = _LenientBuffer(buffer)

    def _maybe_uncompress(self) -> None:
        super()._maybe_uncompress()  # a compressed batch's records get a new buffer
        if not isinstance(self._buffer, _LenientBuffer):
            self._buffer = _LenientBuffer(self._buffer)


class _Batch:
    """The fast (C) batch reader; on a header name that is not UTF-8, the lenient one takes
    over after the records already read. Everything else is the fast batch's."""

    def __init__(self, fast: Any, raw: memoryview) -> None:
        self._fast = fast
        self._raw = raw  # a view of the fetch's bytes: copied only if the lenient reader runs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def __iter__(self) -> Iterator[Any]:
        raw = self._raw
        if len(raw) > _SCAN_ABOVE and _over_header_cap(raw):
            yield from _capped(self._fast, raw)
            return
        read = -1
        try:
            for record in self._fast:
                read = record.offset
                yield record
        except UnicodeDecodeError as exc:
            log.warning(
                "a record batch at offset %d has a header name that is not UTF-8 (%s); "
                "read with the invalid bytes replaced",
                self._fast.base_offset, exc,
            )  # fmt: skip
        else:
            return
        for record in _LenientBatch(bytes(self._raw)):
            if record.offset > read:
                yield record


def _capped(fast: Any, raw: memoryview) -> Iterator[Any]:
    """A batch with a record over MAX_RECORD_HEADERS, read by the Python reader; a record
    it cannot read stands in for the rest (``corrupt-batch``), as in an inflated batch."""
    read = fast.base_offset - 1
    for record in _whole_records(fast, raw, _HEADER.size, _HEADER.unpack_from(raw)[12]):
        read = record.offset
        yield record
    last = fast.base_offset + fast.last_offset_delta
    if read < last:
        note = f"corrupt-batch: offsets {read + 1}..{last} not read: a record is malformed"
        yield _Record(
            last, fast.max_timestamp, fast.timestamp_type, None, None,
            [(UNREAD_HEADER, note.encode())],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Record:
    """A record as the fetcher reads it (the fields of aiokafka's own)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    checksum: None = None


class _InflatedBatch:
    """A compressed v2 batch: header fields, CRC check and control flags are the fast
    batch's (over the compressed bytes, as the broker wrote them); the records are read
    from the batch inflated within ``limit`` bytes."""

    def __init__(self, fast: Any, raw: memoryview, limit: int) -> None:
        self._fast = fast
        self._raw = raw
        self._limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def __iter__(self) -> Iterator[Any]:
        raw, header_size = self._raw, _HEADER.size
        fields = _HEADER.unpack_from(raw)
        attributes, count = fields[5], fields[12]
        codec = attributes & _CODEC_MASK
        buffer = bytearray(raw[:header_size])
        got = inflate(codec, raw[header_size:], self._limit, buffer)
        if got.problem is None:
            struct.pack_into(">i", buffer, 8, len(buffer) - 12)  # Length: after itself
            struct.pack_into(">h", buffer, _ATTRIBUTES_AT, attributes & ~_CODEC_MASK)
            yield from _Batch(default_records.DefaultRecordBatch(buffer), memoryview(buffer))
            return
        last = self._fast.base_offset + self._fast.last_offset_delta
        read = self._fast.base_offset - 1
        for record in _whole_records(self._fast, buffer, header_size, count):
            read = record.offset
            yield record
        reason, detail = got.problem
        log.warning(
            "the %s batch at offset %d of %d records: %s: %s",
            CODEC_NAMES.get(codec, codec), self._fast.base_offset, count, reason, detail,
        )  # fmt: skip
        if read < last:
            note = f"{reason}: offsets {read + 1}..{last} not read: {detail}"
            yield _Record(
                last, self._fast.max_timestamp, self._fast.timestamp_type, None, None,
                [(UNREAD_HEADER, note.encode())],
            )  # fmt: skip


def _over_header_cap(raw: bytearray | memoryview) -> bool:
    """Does a record of this uncompressed v2 batch hold more than MAX_RECORD_HEADERS headers?
    (Only a record longer than two bytes a header can; a malformed batch: no, the reader
    behind says what is wrong with it.)"""
    pos, end = _HEADER.size, len(raw)
    try:
        for _ in range(_HEADER.unpack_from(raw)[12]):
            length, start = decode_varint(raw, pos)
            pos = start + length
            if length > 2 * MAX_RECORD_HEADERS and _header_count(raw, start) > MAX_RECORD_HEADERS:
                return True
            if pos >= end:
                return False
    except (IndexError, ValueError, struct.error):
        return False
    return False


def _header_count(buffer: bytearray | memoryview, pos: int) -> int:
    """The header count of the record whose fields start at ``pos``."""
    for _ in range(3):  # attributes, timestamp delta, offset delta
        _, pos = decode_varint(buffer, pos)
    for _ in range(2):  # key, value
        length, pos = decode_varint(buffer, pos)
        pos += max(length, 0)
    count, _ = decode_varint(buffer, pos)
    return int(count)


def _whole_records(
    batch: Any, buffer: bytearray | memoryview, pos: int, count: int
) -> Iterator[_Record]:
    """The records of an uncompressed batch (or an inflated prefix) that are whole, header
    names read leniently; a record over MAX_RECORD_HEADERS keeps its value and gets one
    :data:`UNREAD_HEADER` (``too-many-headers``) instead of its headers."""
    base, first_ts = batch.base_offset, batch.first_timestamp
    ts_type = batch.timestamp_type
    end = len(buffer)
    for _ in range(count):
        try:
            length, start = decode_varint(buffer, pos)
            if length < 0 or start + length > end:
                return
            record, pos = _record(buffer, start, start + length)
        except (IndexError, ValueError, UnicodeDecodeError):
            return
        offset_delta, ts_delta, key, value, headers = record
        timestamp = batch.max_timestamp if ts_type == 1 else first_ts + ts_delta
        yield _Record(base + offset_delta, timestamp, ts_type, key, value, headers)


def _record(
    buffer: bytearray | memoryview, pos: int, end: int
) -> tuple[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]], int]:
    _, pos = decode_varint(buffer, pos)  # attributes
    ts_delta, pos = decode_varint(buffer, pos)
    offset_delta, pos = decode_varint(buffer, pos)
    key, pos = _nullable(buffer, pos, end)
    value, pos = _nullable(buffer, pos, end)
    n, pos = decode_varint(buffer, pos)
    if n < 0:
        raise ValueError("negative header count")
    if n > MAX_RECORD_HEADERS:
        note = f"too-many-headers: {n} headers; a record's first {MAX_RECORD_HEADERS} are read"
        return (offset_delta, ts_delta, key, value, [(UNREAD_HEADER, note.encode())]), end
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(n):
        name, pos = _nullable(buffer, pos, end)
        if name is None:
            raise ValueError("a header without a name")
        value_h, pos = _nullable(buffer, pos, end)
        headers.append((name.decode("utf-8", "replace"), value_h))
    if pos != end:
        raise ValueError("the record's length does not match its fields")
    return (offset_delta, ts_delta, key, value, headers), pos


def _nullable(buffer: bytearray | memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(buffer, pos)
    if length < 0:
        return None, pos
    if pos + length > end:
        raise ValueError("a field runs past its record")
    return bytes(buffer[pos : pos + length]), pos + length


class LenientMemoryRecords(memory_records._MemoryRecordsPy):  # type: ignore[misc]
    """The fetcher's record set: aiokafka's batch splitting, each v2 batch read by the fast
    reader with the lenient one behind it (v0/v1 batches have no headers); a compressed
    v2 batch inflated within the bound first."""

    def next_batch(self, *args: Any, **kwargs: Any) -> Any:
        raw = self._next_slice
        batch = super().next_batch(*args, **kwargs)
        if raw is None or batch is None or batch.magic < 2 or batch.is_control_batch:
            # a transaction marker: the fetcher reads it with ``next()`` (read_committed),
            # and it holds no header names and nothing to inflate
            return batch
        if batch.attributes & _CODEC_MASK:
            return _InflatedBatch(batch, raw, _limits["batch"])
        return _Batch(batch, raw)


def record_bytes(record: Any) -> int:
    """What a consumed record holds: its value, key and headers (each header counted beside
    its bytes: an empty one costs ~140 bytes read)."""
    size = len(record.value or b"") + len(record.key or b"")
    for name, value in record.headers or ():
        size += _HEADER_BYTES + len(name) + len(value or b"")
    return size


def _bounded_getall(self: Any, max_records: int | None = None) -> list[Any]:
    """``FetchResult.getall`` that also stops once the poll has taken its bytes (at least one
    record per poll): the rest stays in the fetcher, a compressed batch inflated only when
    its turn comes."""
    spent = _poll_spent.get()
    if spent is None:
        return _original_getall(self, max_records)  # type: ignore[no-any-return]
    if not self.check_assignment(self._topic_partition) or not self.has_more():
        return []
    limit = _limits["poll"]
    if spent[0] >= limit:
        return []
    taken: list[Any] = []
    for record in self._partition_records:
        taken.append(record)
        spent[0] += _RECORD_BYTES + record_bytes(record)
        if (max_records is not None and len(taken) >= max_records) or spent[0] >= limit:
            self._update_position()
            break
    else:
        self._update_position()
        self._partition_records = None
    return taken


async def _bounded_fetched_records(
    self: Any,
    partitions: Any,
    timeout: float = 0,  # noqa: ASYNC109 - aiokafka's signature
    max_records: int | None = None,
) -> Any:
    token = _poll_spent.set([0])
    try:
        return await _original_fetched_records(self, partitions, timeout, max_records)
    finally:
        _poll_spent.reset(token)


def install_lenient_header_names(
    *,
    max_batch_inflated_bytes: int = DEFAULT_MAX_BATCH_INFLATED_BYTES,
    max_poll_bytes: int = DEFAULT_MAX_POLL_BYTES,
) -> None:
    """Make every aiokafka consumer of this process read header names leniently, and inflate
    a compressed batch to at most ``max_batch_inflated_bytes`` (idempotent; the last call's
    bound holds for every consumer of the process).

    The fetch limits count compressed bytes, so one fetch of small compressed batches can
    hold gigabytes of records: a poll (``getmany``) also stops taking records once it holds
    ``max_poll_bytes`` of them (keys, values, headers; at least one record), and the rest
    are read, and inflated, by later polls.

    Raises ``RuntimeError`` when aiokafka's internals are not the ones this was written
    for (``aiokafka>=0.14,<0.15``): an upgrade must be checked, not silently lose this.
    """
    needed = (
        hasattr(fetcher, "MemoryRecords"),
        hasattr(memory_records, "_MemoryRecordsPy"),
        hasattr(default_records, "_DefaultRecordBatchPy"),
        hasattr(fetcher.FetchResult, "_update_position"),
        hasattr(fetcher.FetchResult, "check_assignment"),
    )
    if not all(needed):
        raise RuntimeError(
            "aiokafka's record readers are not where guardrail_client.records expects them "
            "(written for aiokafka 0.14): check lenient header names before upgrading"
        )
    if isinstance(max_batch_inflated_bytes, bool) or max_batch_inflated_bytes < 1:
        raise ValueError(f"max_batch_inflated_bytes must be positive: {max_batch_inflated_bytes}")
    if isinstance(max_poll_bytes, bool) or max_poll_bytes < 1:
        raise ValueError(f"max_poll_bytes must be positive: {max_poll_bytes}")
    _limits["batch"] = max_batch_inflated_bytes
    _limits["poll"] = max_poll_bytes
    fetcher.MemoryRecords = LenientMemoryRecords
    fetcher.FetchResult.getall = _bounded_getall
    fetcher.Fetcher.fetched_records = _bounded_fetched_records
