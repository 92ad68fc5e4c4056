"""Dead letters on ``rag.dlq``: the ``x-dlq-*`` headers that say why a message is there."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

DLQ_HEADER_PREFIX = "x-dlq-"


class DeadLetterRecord(BaseModel):
    """What a ``rag.dlq`` message says about itself, in its headers.

    The message value is the original bytes, untouched; the original key and
    headers are kept, their values as the original bytes. These fields travel
    as ``x-dlq-<field>`` headers (UTF-8).

    A dead letter that cannot fit into the DLQ topic whole is cut down to fit:
    ``truncated`` is then true, the value is the first bytes of the original,
    ``original_size`` / ``original_sha256`` describe the original value,
    ``truncated_reason`` says which limit was hit and ``dropped_headers`` names
    the original headers left out.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reason: Annotated[
        str,
        StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64),
        Field(
            description="machine-readable slug of what was wrong, e.g. malformed-json, "
            "schema-violation, missing-schema-version, unknown-schema-version, "
            "wrong-event-type, untrusted-tenant, tenant-mismatch, duplicate-conflict, "
            "after-final, unknown-collection, or output-too-large (an output its own topic "
            "refused); the README's dead-letter reasons table lists every one with what was "
            "wrong and what the producer should do. More may be added within schema_version "
            "1: match on the ones you handle, treat others as unusable input."
        ),
    ]
    detail: Annotated[str, StringConstraints(max_length=2_000)] = Field(
        description="human-readable detail (at most 2,000 characters, less when the dead "
        "letter was cut to fit); never match on it"
    )
    source_topic: str = Field(
        description="the topic the message was read from; for output-too-large, the topic "
        "the output was meant for"
    )
    source_partition: int = Field(
        description="the partition it was read from; -1 for output-too-large (never published)"
    )
    source_offset: int = Field(
        description="its offset in that partition; -1 for output-too-large (never published)"
    )
    request_id: str | None = Field(
        default=None,
        description="the request it belongs to: the event's own request_id once it was read, "
        "else the record's key when that could be a request id (for output-too-large, the "
        "output's key); absent when neither is known",
    )
    failed_at: datetime = Field(description="when the sidecar dead-lettered it (UTC)")
    sidecar_version: str = Field(description="version of the sidecar that dead-lettered it")
    truncated: bool | None = Field(
        default=None,
        description="true when the dead letter was cut down to fit the DLQ topic (the value "
        "is then the first bytes of the original); absent otherwise",
    )
    original_size: int | None = Field(
        default=None,
        description="bytes of the original value; set only when truncated",
    )
    original_sha256: str | None = Field(
        default=None,
        description="sha256 of the original value, 64 hex digits; set only when truncated",
    )
    truncated_reason: str | None = Field(
        default=None,
        description="which size limit was hit, in words (at most 256 bytes); set only when "
        "truncated",
    )
    dropped_headers: str | None = Field(
        default=None,
        description="names of the original headers left out, comma-separated (at most 128 "
        "bytes, ending in +N when N more names did not fit); set only when truncated and "
        "headers were dropped",
    )

    def to_headers(self) -> list[tuple[str, bytes]]:
        dumped = self.model_dump(mode="json", exclude_none=True)
        return [(dlq_header(k), _header_text(v).encode("utf-8")) for k, v in dumped.items()]

    @classmethod
    def from_headers(
        cls, headers: Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]]
    ) -> Self:
        """Read the ``x-dlq-*`` headers back (values as bytes, as Kafka hands them, or text)."""
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        fields = {
            k[len(DLQ_HEADER_PREFIX) :].replace("-", "_"): (
                v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
            )
            for k, v in pairs
            if k.startswith(DLQ_HEADER_PREFIX)
        }
        return cls.model_validate(fields)


def dlq_header(field_name: str) -> str:
    """``source_topic`` -> ``x-dlq-source-topic``."""
    return f"{DLQ_HEADER_PREFIX}{field_name.replace('_', '-')}"


def _header_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
