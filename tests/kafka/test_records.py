"""Consumed records whatever their headers hold: null values, names that are not UTF-8,
millions of them.

Batches are built with aiokafka's own (pure-Python) builder, which writes a header
name as whatever its ``encode()`` returns, as a Go or C producer may send it.
"""

from __future__ import annotations

import tracemalloc

import pytest
from aiokafka.record import default_records, memory_records

from guardrail_client.inflate import UNREAD_HEADER
from guardrail_client.records import MAX_RECORD_HEADERS, record_bytes
from sidecar.kafka.records import LenientMemoryRecords, input_headers
from tests.kafka.bad_header_name import BAD_NAME, RawName

CODEC_NONE, CODEC_GZIP = 0, 1


def batch(headers: list[list[tuple[str, bytes | None]]], codec: int = CODEC_NONE) -> bytes:
    builder = default_records._DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, hs in enumerate(headers):
        builder.append(offset, timestamp=None, key=b"k", value=f"v{offset}".encode(), headers=hs)
    return bytes(builder.build())


BAD = RawName(BAD_NAME)


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP])
def test_a_header_name_that_is_not_utf8_costs_nothing_but_its_spelling(codec: int) -> None:
    raw = batch([[("traceparent", b"00-a")], [(BAD, b"v"), ("x-tenant", b"acme")], []], codec)
    with pytest.raises(UnicodeDecodeError):  # what aiokafka's own reader does with it
        list(memory_records.MemoryRecords(raw).next_batch())
    records = LenientMemoryRecords(raw)
    assert records.has_next()
    read = records.next_batch()
    assert read.validate_crc()  # the rest is the fast reader's
    got = list(read)
    assert [r.offset for r in got] == [0, 1, 2]  # every record, once, in order
    assert [r.value for r in got] == [b"v0", b"v1", b"v2"]
    assert got[1].headers == [("\ufffd\ufffd-name", b"v"), ("x-tenant", b"acme")]
    assert got[0].headers == [("traceparent", b"00-a")]
    assert not records.has_next()


def test_good_batches_are_read_by_the_fast_reader_unchanged() -> None:
    raw = batch([[("a", b"1")], [("b", None)]])
    fast = list(memory_records.MemoryRecords(raw).next_batch())
    lenient = list(LenientMemoryRecords(raw).next_batch())
    assert [(r.offset, r.key, r.value, r.headers) for r in lenient] == [
        (r.offset, r.key, r.value, r.headers) for r in fast
    ]
    assert type(lenient[0]) is type(fast[0])  # the C reader's records: no slow path


def test_null_header_values_become_empty_bytes() -> None:
    assert input_headers([("a", None), ("b", b"x")]) == (("a", b""), ("b", b"x"))
    assert input_headers(None) == ()


BOMB_HEADERS = 200_000  # 2 bytes each on the wire: a 400 KB record


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_GZIP])
def test_a_record_with_too_many_headers_keeps_its_value_and_costs_no_memory(codec: int) -> None:
    """200,000 empty headers: 400 KB in Kafka, ~68 MB once aiokafka's reader has made a
    tuple of each; a 16 MiB record held 8 million (~2.7 GB: the pod OOM-killed, and again
    on every restart, the record being uncommitted)."""
    bomb: list[tuple[str, bytes | None]] = [("", b"")] * BOMB_HEADERS
    at_cap: list[tuple[str, bytes | None]] = [("h", b"v")] * MAX_RECORD_HEADERS
    raw = batch([[("traceparent", b"00-a")], bomb, at_cap, []], codec)
    tracemalloc.start()
    try:
        got = list(LenientMemoryRecords(raw).next_batch())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [r.offset for r in got] == [0, 1, 2, 3]
    assert [r.value for r in got] == [b"v0", b"v1", b"v2", b"v3"]
    assert got[0].headers == [("traceparent", b"00-a")]
    [(name, note)] = got[1].headers
    assert name == UNREAD_HEADER
    assert note.decode().startswith(f"too-many-headers: {BOMB_HEADERS} headers")
    assert len(got[2].headers) == MAX_RECORD_HEADERS  # at the cap: read as it is
    assert got[3].headers == []
    assert peak < 4 << 20, peak  # aiokafka's reader: 12.2 MiB (200,000 tuples); gzip: 1.5
    assert record_bytes(got[2]) >= MAX_RECORD_HEADERS * 128  # headers counted, not only bytes


def test_a_small_batch_is_read_by_the_fast_reader_without_a_scan() -> None:
    """Below 64 KiB a batch holds at most ~32,000 headers: no scan, the C reader's records."""
    raw = batch([[("", b"")] * 20_000])
    [record] = list(LenientMemoryRecords(raw).next_batch())
    assert len(record.headers) == 20_000
    assert type(record) is type(next(iter(memory_records.MemoryRecords(raw).next_batch())))
