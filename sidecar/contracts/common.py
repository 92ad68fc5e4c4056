"""What every event contract shares: the schema version, the base event and constrained types."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

SCHEMA_VERSION = 1
"""The version this build writes. Readers accept ``SUPPORTED_SCHEMA_VERSIONS``."""
SUPPORTED_SCHEMA_VERSIONS: frozenset[int] = frozenset({1})

# at least one letter or digit: "." and ".." are path tricks, not request ids
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._:\-]*[A-Za-z0-9][A-Za-z0-9._:\-]*$"
REQUEST_ID_MAX_CHARS = 128
RequestId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=REQUEST_ID_MAX_CHARS, pattern=REQUEST_ID_PATTERN),
]
NAME_MAX_CHARS = 256
Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX_CHARS)]
# The names that key calibrations and label metrics (tenant, collection, retriever) reach
# metric labels, span attributes and terminals as they are: no control characters (C0,
# DEL, C1), line separators or bidirectional overrides, which rewrite what a label or a
# log line shows (audit: an ESC sequence in a collection name reached the Prometheus
# exposition as is). Ids that only reach JSON (chunk and document ids, the generator, a
# feedback source) keep plain Name: one bidi mark copied from a right-to-left document
# into a doc_id must not cost the request its verdict (review).
# (Escapes, not the characters: Python's re, pydantic's Rust regex and the JSON Schema's
# ECMA-262 all read them, and error messages that quote the pattern stay printable.)
NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+$"
NAME_RULE = "no control characters, line separators or bidirectional overrides"
LabelName = Annotated[
    str, StringConstraints(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)
]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class EventBase(BaseModel):
    # every event: frozen, no unknown fields, no NaN, an explicit schema_version
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    schema_version: Literal[1] = Field(
        default=1,
        description="The contract version the event was written under: 1 in this release. "
        "The sidecar dead-letters an input without it (missing-schema-version) or with "
        "another value (unknown-schema-version).",
    )
