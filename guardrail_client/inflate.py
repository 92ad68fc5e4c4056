"""A compressed record batch inflated within a bound, whatever its codec.

``max.message.bytes`` and the fetch sizes count a batch's *compressed* bytes. aiokafka
inflates a whole batch at once (a 600 KB gzip batch became 600 MiB in the consumer,
OOM-killed on every restart with the partition stuck), and reads lz4, snappy and zstd
only when cramjam is installed (without it, every fetch of the partition raised). Here
each codec is read as a stream, at most ``limit`` bytes of it: :func:`inflate` appends
the records' bytes to a buffer and says whether it got all of them. The caller
(:mod:`guardrail_client.records`) reads the records that came out whole and stands one
record in for the rest (:data:`UNREAD_HEADER`), so that the rest is dead-lettered with
its reason rather than lost or read without bound.

The codec libraries (lz4, zstandard, cramjam for snappy) are imported when a batch
needs them: a missing one is a reason (``unsupported-codec``), not an exception.
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["CODEC_NAMES", "UNREAD_HEADER", "Inflated", "inflate"]

# The header of the record that stands in for the records of a batch that could not be
# read: its value is ``<reason>: <detail>`` (reasons: ``batch-too-large``,
# ``corrupt-batch``, ``unsupported-codec``). A producer can set it on its own record,
# which then costs that record only.
UNREAD_HEADER = "x-guardrail-unread"

CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_CHUNK = 1 << 20  # bytes asked of a decompressor at a time
_XERIAL = b"\x82SNAPPY\x00"  # the snappy-java block stream's magic (the Java producer's)
_ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default limit on a frame's window, made explicit
_local = threading.local()


@dataclass(frozen=True, slots=True)
class Inflated:
    """What :func:`inflate` got: ``problem`` is None when every byte came out within the
    limit, else ``(reason, detail)``; the buffer then holds a prefix of the records."""

    size: int
    problem: tuple[str, str] | None = None


class _Corrupt(Exception):
    pass


class _Over(Exception):
    """A snappy block would inflate past the limit (a block comes out all at once)."""


def inflate(codec: int, payload: bytes | memoryview, limit: int, out: bytearray) -> Inflated:
    """Append ``payload`` inflated with Kafka codec ``codec`` to ``out``: at most ``limit``
    bytes."""
    name = CODEC_NAMES.get(codec)
    if name is None:
        return Inflated(0, ("unsupported-codec", f"compression codec {codec} is not a Kafka codec"))
    size = 0

    def room() -> int:  # what may still come out: one byte past the limit says "too large"
        return limit + 1 - size

    too_large = (
        "batch-too-large",
        f"a {name} batch of {len(payload)} bytes inflates past {limit} bytes "
        "(GUARDRAIL_KAFKA__MAX_BATCH_INFLATED_BYTES)",
    )
    try:
        for chunk in _STREAMS[codec](memoryview(payload), room):
            size += len(chunk)
            if size > limit:
                out += memoryview(chunk)[: len(chunk) - (size - limit)]
                return Inflated(limit, too_large)
            out += chunk
    except _Over:
        return Inflated(size, too_large)
    except ImportError as exc:
        return Inflated(
            size, ("unsupported-codec", f"no {name} library in this process ({exc.name})")
        )
    except (_Corrupt, zlib.error, RuntimeError, ValueError, OSError) as exc:
        detail = f"the {name} stream is not valid after {size} bytes: {exc}"
        return Inflated(size, ("corrupt-batch", detail[:500]))
    return Inflated(size)


_Room = Callable[[], int]


def _gzip(payload: memoryview, room: _Room) -> Iterator[bytes]:
    data: bytes | memoryview = payload
    d = zlib.decompressobj(wbits=31)
    while True:
        chunk = d.decompress(data, min(_CHUNK, room()))
        rest = d.unconsumed_tail
        if chunk:
            yield chunk
        if d.eof:
            data = d.unused_data
            if not data.strip(b"\x00"):  # nothing, or padding: the end
                return
            d = zlib.decompressobj(wbits=31)  # another gzip member follows
            continue
        if not chunk and (not rest or len(rest) == len(data)):
            raise _Corrupt("the stream ends before its end marker")
        data = rest


def _lz4(payload: memoryview, room: _Room) -> Iterator[bytes]:
    import lz4.frame  # noqa: PLC0415  (a codec library: only when a batch needs it)

    d = lz4.frame.LZ4FrameDecompressor()
    data: bytes = bytes(payload)
    while True:
        chunk = d.decompress(data, max_length=min(_CHUNK, room()))
        data = b""
        if chunk:
            yield chunk
        if d.eof:
            return
        if not chunk and d.needs_input:
            raise _Corrupt("truncated")


def _zstd(payload: memoryview, room: _Room) -> Iterator[bytes]:
    import zstandard  # noqa: PLC0415

    d = getattr(_local, "zstd", None)
    if d is None:  # a context costs ~0.5 ms to make: one per thread (they are not shared)
        d = _local.zstd = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    try:
        with d.stream_reader(bytes(payload), read_across_frames=True) as reader:
            while chunk := reader.read(min(_CHUNK, room())):
                yield chunk
    except zstandard.ZstdError as exc:
        raise _Corrupt(str(exc)) from None


def _snappy(payload: memoryview, room: _Room) -> Iterator[bytes]:
    import cramjam  # noqa: PLC0415

    if bytes(payload[: len(_XERIAL)]) != _XERIAL:
        yield from _snappy_block(cramjam, payload, room)  # a raw snappy batch (librdkafka's)
        return
    pos, end = 16, len(payload)  # magic, version, compatible version
    while pos < end:
        if pos + 4 > end:
            raise _Corrupt("a block length is cut short")
        (length,) = struct.unpack_from(">i", payload, pos)
        if length < 0 or pos + 4 + length > end:
            raise _Corrupt(f"a block of {length} bytes at {pos} runs past the batch")
        yield from _snappy_block(cramjam, payload[pos + 4 : pos + 4 + length], room)
        pos += 4 + length


def _snappy_block(cramjam: object, block: memoryview, room: _Room) -> Iterator[bytes]:
    snappy = cramjam.snappy  # type: ignore[attr-defined]
    try:
        size = snappy.decompress_raw_len(block)
        if size >= room():  # a block inflates all at once: its length is read first
            raise _Over
        yield bytes(snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:  # type: ignore[attr-defined]
        raise _Corrupt(str(exc)) from None


_STREAMS: dict[int, Callable[[memoryview, _Room], Iterator[bytes]]] = {
    1: _gzip,
    2: _snappy,
    3: _lz4,
    4: _zstd,
}
