"""Dead letters on ``rag.dlq``: the ``x-dlq-*`` headers that say why a message is there."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, StringConstraints

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

    reason: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.\-]*$", max_length=64)]
    detail: Annotated[str, StringConstraints(max_length=2_000)]
    source_topic: str
    source_partition: int
    source_offset: int
    request_id: str | None = None
    failed_at: datetime
    sidecar_version: str
    truncated: bool | None = None
    original_size: int | None = None
    original_sha256: str | None = None
    truncated_reason: str | None = None
    dropped_headers: str | None = None

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
