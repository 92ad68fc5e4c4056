"""Consumed records as the pipeline takes them, whatever a producer put in their headers.

Kafka lets a header value be null, and aiokafka (0.14) hands it over as ``None``;
the pipeline's headers are bytes, so :func:`input_headers` turns a null value into
``b""`` (a dead letter carries it as an empty value).

A header *name* is a protocol String, but the broker does not check it, and a Go
or C producer can send any bytes. aiokafka decodes names strictly while it
unpacks a fetch, so one name that is not UTF-8 raised ``UnicodeDecodeError`` out
of every ``getmany``: FastStream restarted its consume task hundreds of times a
second, nothing was read from any partition again (the record sits at the
committed position, so a restart does not help) and memory grew with the dead
tasks. :func:`install_lenient_header_names` makes the fetcher read such a batch
again with the pure-Python reader, decoding names as Java's consumer does (an
invalid byte becomes U+FFFD): the record goes on like any other, one bad name
costing nothing more than its spelling.
"""

from __future__ import annotations

from collections.abc import Iterable

# the lenient reader lives with the client, whose consumer needs it too (and may import no
# sidecar.kafka module); re-exported here for the sidecar's service start
from guardrail_client.records import LenientMemoryRecords, install_lenient_header_names
from sidecar.config import TopicSettings
from sidecar.contracts.codec import InputKind

__all__ = [
    "Header",
    "LenientMemoryRecords",
    "input_headers",
    "input_kinds",
    "install_lenient_header_names",
]

Header = tuple[str, bytes]


def input_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> tuple[Header, ...]:
    """A consumed record's headers with null values as ``b""``."""
    return tuple((name, b"" if value is None else value) for name, value in headers or ())


def input_kinds(topics: TopicSettings) -> dict[str, InputKind]:
    """Each input topic's name -> the kind of event the pipeline reads from it."""
    return {
        topics.retrieval: InputKind.RETRIEVAL,
        topics.generation: InputKind.GENERATION,
        topics.feedback: InputKind.FEEDBACK,
    }
