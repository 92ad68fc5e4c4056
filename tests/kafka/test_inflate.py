"""Compressed batches, every Kafka codec: read whole within the bound, never inflated past it.

aiokafka inflates a whole batch at once (the audit's 600 KB gzip batch: 600 MiB in the
consumer, OOM-killed on every restart) and read lz4, snappy and zstd only with cramjam
installed (without it, every fetch of the partition raised). Batches are built with
aiokafka's own builder; a "bomb" is one record of zeros that compresses ~1000x.
"""

from __future__ import annotations

import struct
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest
from aiokafka.record import default_records, memory_records

from guardrail_client import records as lenient
from guardrail_client.inflate import UNREAD_HEADER, inflate
from guardrail_client.records import LenientMemoryRecords
from tests.kafka.bad_header_name import BAD_NAME, RawName

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
MiB = 1 << 20


def batch(
    values: list[bytes], codec: int, headers: list[tuple[object, bytes]] | None = None
) -> bytes:
    builder = default_records._DefaultRecordBatchBuilderPy(
        magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 30,
    )  # fmt: skip
    for offset, value in enumerate(values):
        builder.append(
            offset, timestamp=1_700_000_000_000 + offset, key=f"k{offset}".encode(),
            value=value, headers=list(headers or []),
        )  # fmt: skip
    raw = bytes(builder.build())
    attributes = struct.unpack_from(">h", raw, default_records.DefaultRecordBase.ATTRIBUTES_OFFSET)
    assert attributes[0] & 0x07 == codec  # the builder keeps a batch that does not shrink plain
    return raw


def read(raw: bytes) -> list[object]:
    records = LenientMemoryRecords(raw)
    got = records.next_batch()
    assert got.validate_crc()  # over the compressed bytes, as the broker wrote them
    out = list(got)
    assert not records.has_next()
    return out


@pytest.fixture
def limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setitem(lenient._limits, "batch", 4 * MiB)
    yield 4 * MiB


@pytest.mark.parametrize("codec", CODECS)
def test_a_compressed_batch_reads_as_its_uncompressed_twin(codec: str) -> None:
    values = [f'{{"n": {i}, "text": "{"abc" * i}"}}'.encode() for i in range(50)]
    plain = list(memory_records.MemoryRecords(batch(values, 0)).next_batch())
    got = read(batch(values, CODECS[codec], [("traceparent", b"00-x")]))
    assert [(r.offset, r.key, r.value, r.timestamp) for r in got] == [  # type: ignore[attr-defined]
        (r.offset, r.key, r.value, r.timestamp) for r in plain
    ]
    assert all(r.headers == [("traceparent", b"00-x")] for r in got)  # type: ignore[attr-defined]


@pytest.mark.parametrize("codec", CODECS)
def test_a_bad_header_name_in_a_compressed_batch_costs_its_spelling(codec: str) -> None:
    values = [b"v0" * 100, b"v1" * 100]
    got = read(batch(values, CODECS[codec], [(RawName(BAD_NAME), b"v")]))
    assert [r.value for r in got] == values  # type: ignore[attr-defined]
    assert got[0].headers == [("\ufffd\ufffd-name", b"v")]  # type: ignore[attr-defined]


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_costs_itself_and_what_follows_it_in_its_batch_never_memory(
    codec: str, limit: int
) -> None:
    bomb = bytes(40 * MiB)  # zeros: a few KiB compressed
    raw = batch([b"first", b"second", bomb, b"after"], CODECS[codec])
    assert len(raw) < 2 * MiB
    tracemalloc.start()
    try:
        got = read(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * limit  # measured ~1.5x (a 1 MiB chunk in flight); aiokafka: 80 MiB
    assert [r.value for r in got[:2]] == [b"first", b"second"]  # type: ignore[attr-defined]
    [stand_in] = got[2:]
    assert stand_in.offset == 3 and stand_in.value is None  # type: ignore[attr-defined]
    [(name, note)] = stand_in.headers  # type: ignore[attr-defined]
    assert name == UNREAD_HEADER
    assert note.startswith(b"batch-too-large: offsets 2..3 not read")
    assert f"inflates past {limit}".encode() in note


def test_a_corrupt_stream_keeps_the_records_before_the_damage() -> None:
    values = [bytes([65 + i % 26]) * 3000 + str(i).encode() for i in range(40)]
    raw = bytearray(batch(values, CODECS["gzip"]))
    raw[-100:-90] = b"\xff" * 10  # past the first records' deflate blocks
    got = read_unchecked(bytes(raw))
    *whole, stand_in = got
    assert [r.value for r in whole] == values[: len(whole)]  # type: ignore[attr-defined]
    assert stand_in.offset == 39  # type: ignore[attr-defined]
    note = dict(stand_in.headers)[UNREAD_HEADER]  # type: ignore[attr-defined]
    assert note.startswith(b"corrupt-batch: offsets ")


def read_unchecked(raw: bytes) -> list[object]:
    return list(LenientMemoryRecords(raw).next_batch())  # CRC not checked: the damage is ours


def test_a_codec_without_its_library_is_a_reason_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    raw = batch([b"v0" * 100, b"v1" * 100], CODECS["zstd"])
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import fails
    [stand_in] = read(raw)
    assert stand_in.offset == 1  # type: ignore[attr-defined]
    note = dict(stand_in.headers)[UNREAD_HEADER]  # type: ignore[attr-defined]
    assert note.startswith(b"unsupported-codec: offsets 0..1 not read: no zstd library")


@pytest.mark.parametrize("codec", CODECS)
def test_inflate_stops_one_byte_past_the_limit(codec: str) -> None:
    values = [bytes(3000) for _ in range(100)]
    raw = batch(values, CODECS[codec])
    payload = memoryview(raw)[default_records.DefaultRecordBase.HEADER_STRUCT.size :]
    whole = bytearray()
    assert inflate(CODECS[codec], payload, 10 * MiB, whole).problem is None
    for cut in (1, len(whole) // 2, len(whole) - 1):
        out = bytearray()
        got = inflate(CODECS[codec], payload, cut, out)
        assert got.problem is not None and got.problem[0] == "batch-too-large"
        assert len(out) <= cut and bytes(out) == bytes(whole[: len(out)])
    exact = bytearray()
    assert inflate(CODECS[codec], payload, len(whole), exact).problem is None


def test_gzip_with_trailing_padding_and_two_members_reads_whole() -> None:
    member = zlib.compressobj(wbits=31)
    a = member.compress(b"abc") + member.flush()
    out = bytearray()
    assert inflate(1, a + a + b"\x00" * 8, 100, out).problem is None
    assert bytes(out) == b"abcabc"
    cut = bytearray()
    assert inflate(1, a[:-4], 100, cut).problem[0] == "corrupt-batch"  # type: ignore[index]


def test_a_snappy_block_claiming_more_than_the_limit_is_not_inflated() -> None:
    import cramjam

    block = bytes(cramjam.snappy.compress_raw(bytes(2 * MiB)))
    xerial = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    out = bytearray()
    got = inflate(2, xerial, MiB, out)
    assert got.problem is not None and got.problem[0] == "batch-too-large" and not out
