"""Header names that are not UTF-8 must not stop a consumer (moved from sidecar.kafka.records).

A header *name* is a protocol String, but the broker does not check it, and a Go
or C producer can send any bytes. aiokafka decodes names strictly while it
unpacks a fetch, so one name that is not UTF-8 raises ``UnicodeDecodeError`` out
of every ``getmany``. :func:`install_lenient_header_names` makes the fetcher read
such a batch again with the pure-Python reader, decoding names as Java's consumer
does (an invalid byte becomes U+FFFD). Both the sidecar's consumer and
``VerdictClient``'s install it; it lives here because the client imports no
``sidecar.kafka`` module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from aiokafka.consumer import fetcher
from aiokafka.record import default_records, memory_records

__all__ = ["LenientMemoryRecords", "install_lenient_header_names"]

log = logging.getLogger("guardrail_client")


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


class LenientMemoryRecords(memory_records._MemoryRecordsPy):  # type: ignore[misc]
    """The fetcher's record set: aiokafka's batch splitting, each v2 batch read by the fast
    reader with the lenient one behind it (v0/v1 batches have no headers)."""

    def next_batch(self, *args: Any, **kwargs: Any) -> Any:
        raw = self._next_slice
        batch = super().next_batch(*args, **kwargs)
        if raw is None or batch is None or batch.magic < 2:
            return batch
        return _Batch(batch, raw)


def install_lenient_header_names() -> None:
    """Make every aiokafka consumer of this process read header names leniently (idempotent).

    Raises ``RuntimeError`` when aiokafka's internals are not the ones this was written
    for (``aiokafka>=0.14,<0.15``): an upgrade must be checked, not silently lose this.
    """
    needed = (
        hasattr(fetcher, "MemoryRecords"),
        hasattr(memory_records, "_MemoryRecordsPy"),
        hasattr(default_records, "_DefaultRecordBatchPy"),
    )
    if not all(needed):
        raise RuntimeError(
            "aiokafka's record readers are not where guardrail_client.records expects them "
            "(written for aiokafka 0.14): check lenient header names before upgrading"
        )
    fetcher.MemoryRecords = LenientMemoryRecords
