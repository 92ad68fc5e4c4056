"""Bytes in, events out (and back): pydantic's JSON mode, bounded, every failure named.

``decode_input`` never lets an exception other than ``InputError`` escape, and
every ``InputError`` carries a reason slug that ends up in the DLQ headers:

  oversize, invalid-utf8, malformed-json, too-deep, not-an-object,
  missing-schema-version, unknown-schema-version, wrong-event-type,
  schema-violation

Two paths, one answer. The fast path validates the bytes directly (pydantic's
JSON mode, strict: no intermediate dict); it only accepts what the checked
path accepts (``_fast_path_safe`` sends everything else there), and anything
it does not accept goes through the checked path (orjson, then each envelope
check, then the model), which names the reason. A test holds the two equal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Final

import orjson
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from sidecar.contracts.common import (
    NAME_PATTERN,
    NAME_RULE,
    REQUEST_ID_MAX_CHARS,
    REQUEST_ID_PATTERN,
)
from sidecar.contracts.events import (
    SUPPORTED_SCHEMA_VERSIONS,
    FeedbackEvent,
    GenerationDelta,
    GenerationFinal,
    InputEvent,
    RetrievalEvent,
)
from sidecar.exceptions import InputError


class InputKind(StrEnum):
    """Which input topic a message came from; decides which event types are allowed."""

    RETRIEVAL = "retrieval"
    GENERATION = "generation"
    FEEDBACK = "feedback"


_MODELS: Final[
    dict[
        InputKind,
        dict[str, type[RetrievalEvent | GenerationDelta | GenerationFinal | FeedbackEvent]],
    ]
] = {
    InputKind.RETRIEVAL: {"retrieval": RetrievalEvent},
    InputKind.GENERATION: {
        "generation.delta": GenerationDelta,
        "generation.final": GenerationFinal,
    },
    InputKind.FEEDBACK: {"feedback": FeedbackEvent},
}


_ADAPTERS: Final[dict[InputKind, TypeAdapter[InputEvent | FeedbackEvent]]] = {
    InputKind.RETRIEVAL: TypeAdapter(RetrievalEvent),
    InputKind.GENERATION: TypeAdapter(
        Annotated[GenerationDelta | GenerationFinal, Field(discriminator="event_type")]
    ),
    InputKind.FEEDBACK: TypeAdapter(FeedbackEvent),
}
# each adapter's pydantic-core validator, called directly: ``TypeAdapter.validate_json``'s
# Python wrapper (its keyword checks and forwarding) cost ~0.35 us a record, a quarter of a
# delta's validation
_VALIDATE_JSON: Final[dict[InputKind, Callable[..., InputEvent | FeedbackEvent]]] = {
    kind: adapter.validator.validate_json for kind, adapter in _ADAPTERS.items()
}
# the deepest nesting a valid input event has (retrieval: object > hits > hit)
MODEL_DEPTH: Final = 3
_VERSION_KEY: Final = b'"schema_version"'
_VERSION_ONE: Final = re.compile(rb'"schema_version"\s*:\s*1\s*[,}]')
_VERSION_ONE_PLAIN: Final = (b'"schema_version":1,', b'"schema_version":1}')  # no spaces
# orjson reads integers above this as floats; JSON mode keeps them exact
_ORJSON_MAX_INT: Final = 2**64 - 1
# Confluent Schema Registry's wire format: magic byte 0, a 4-byte schema id, the JSON
# (what its JSON Schema serializers write); JSON text never starts with a NUL byte
_REGISTRY_MAGIC: Final = b"\x00"
_REGISTRY_HEADER_BYTES: Final = 5


def _fast_path_safe(raw: bytes, max_depth: int) -> bool:
    """Can the fast path's yes be trusted to equal the checked path's? (Cheap byte scans.)

    The model's ``schema_version`` is ``Literal[1]``, which JSON mode accepts as
    ``1.0`` or ``true`` too, and defaults when missing: the key must appear once,
    literally, with the integer 1 (no ``\\u`` escape can spell a second copy of
    it).
    """
    if max_depth < MODEL_DEPTH or (raw.find(b"\\") >= 0 and raw.find(b"\\u") >= 0):
        return False  # (``find`` of one byte is a memchr; ``in`` costs twice as much)
    # the key once: ``raw.count(key) == 1`` without a second scan from the start
    at = raw.find(_VERSION_KEY)
    if at < 0 or raw.find(_VERSION_KEY, at + len(_VERSION_KEY)) >= 0:
        return False
    # the value 1 where the key is (the pattern starts with the key, so this is the
    # ``search``'s answer; only JSON that cannot parse, a key overlapping a second copy
    # of itself, ``"schema_version"schema_version"``, tells them apart); spelt as
    # serialisers write it, it is a ``startswith``, not a regular expression
    return raw.startswith(_VERSION_ONE_PLAIN, at) or _VERSION_ONE.match(raw, at) is not None


def _same_as_checked(event: InputEvent | FeedbackEvent) -> bool:
    """The one field where a valid fast-path value can differ: ``deltas`` has no upper
    bound, and orjson reads an integer beyond 64 bits as a (rounded) float. (The fast
    path asks ``type(event) is not GenerationFinal`` first, inline: its models are exact.)"""
    return not (isinstance(event, GenerationFinal) and (event.deltas or 0) > _ORJSON_MAX_INT)


def _depth_exceeds(obj: Any, limit: int) -> bool:
    """True when ``obj`` nests lists/dicts deeper than ``limit`` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return False


def summarise_validation(exc: ValidationError, limit: int = 3) -> str:
    """``where: what`` for the first ``limit`` problems of a pydantic error, and how many
    more (not pydantic's own text, with its input dumps and documentation links)."""
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        pattern = (err.get("ctx") or {}).get("pattern")
        parts.append(f"{loc}: {NAME_RULE}" if pattern == NAME_PATTERN else f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def decode_input(
    kind: InputKind, raw: bytes | None, *, max_bytes: int, max_depth: int
) -> InputEvent | FeedbackEvent:
    """Decode one input message or raise ``InputError`` with a reason slug."""
    if raw is None:
        raise InputError("malformed-json", "message has no value (tombstone)")
    if len(raw) > max_bytes:
        raise InputError(
            "oversize", f"message is {len(raw)} bytes, the limit is {max_bytes} (max_message_bytes)"
        )
    if raw[:1] == _REGISTRY_MAGIC:
        raw = unframed(raw)
    if _fast_path_safe(raw, max_depth):
        try:
            event = _VALIDATE_JSON[kind](raw, strict=True)
        except ValidationError:
            pass  # the checked path names what is wrong
        else:
            if type(event) is not GenerationFinal or _same_as_checked(event):
                return event
    return decode_checked(kind, raw, max_depth=max_depth)


def unframed(raw: bytes) -> bytes:
    """The JSON of a value in Schema Registry's wire format (``0``, schema id, JSON): read as
    the plain JSON it frames; the schema id is not looked up (the sidecar validates every
    event against its own models)."""
    if len(raw) <= _REGISTRY_HEADER_BYTES:
        raise InputError(
            "malformed-json",
            f"a value that starts with a NUL byte is read in Schema Registry's wire format "
            f"(magic byte 0, a 4-byte schema id, then the JSON); this one is {len(raw)} bytes",
        )
    return raw[_REGISTRY_HEADER_BYTES:]


def decode_checked(kind: InputKind, raw: bytes, *, max_depth: int) -> InputEvent | FeedbackEvent:
    """The checked path: orjson, each envelope check in turn, then the model (strict JSON)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise InputError("invalid-utf8", f"message is not valid UTF-8: {uexc}") from None
        if "depth limit" in str(exc).lower() or "recursion" in str(exc).lower():
            raise InputError("too-deep", f"JSON nests deeper than {max_depth}") from None
        raise InputError("malformed-json", f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InputError("not-an-object", f"expected a JSON object, got {type(obj).__name__}")
    if _depth_exceeds(obj, max_depth):
        raise InputError("too-deep", f"JSON nests deeper than {max_depth} (max_json_depth)")
    version = obj.get("schema_version")
    if version is None:
        raise InputError("missing-schema-version", "schema_version is missing")
    if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise InputError(
            "unknown-schema-version",
            f"schema_version {version!r} is not supported; supported: "
            f"{sorted(SUPPORTED_SCHEMA_VERSIONS)}",
        )
    event_type = obj.get("event_type")
    model = _MODELS[kind].get(event_type) if isinstance(event_type, str) else None
    if model is None:
        raise InputError(
            "wrong-event-type",
            f"event_type {event_type!r} is not allowed on the {kind.value} topic; "
            f"allowed: {sorted(_MODELS[kind])}",
        )
    try:  # strict, as the fast path and the published JSON schemas: "k": "2" is no integer
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise InputError("schema-violation", summarise_validation(exc)) from None


_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def request_id_hint(raw: bytes | None, key: bytes | None) -> str | None:
    """Best-effort request id for a dead letter: the Kafka key when it is one a request id
    could be, else nothing (audit: a key with CR, LF, ANSI escapes and NUL went verbatim into
    ``x-dlq-request-id``, which DLQ tools print; the key itself stays the record's key)."""
    if key and len(key) <= REQUEST_ID_MAX_CHARS:
        try:
            text = key.decode("ascii")
        except UnicodeDecodeError:
            return None
        return text if _REQUEST_ID.match(text) else None
    return None


def encode(event: BaseModel) -> bytes:
    """Serialise an event to compact JSON (datetimes as RFC 3339) in one pass.

    pydantic's serializer writes the bytes directly: the same bytes as
    ``orjson.dumps(event.model_dump(mode="json"))`` without the dict in between.
    """
    return type(event).__pydantic_serializer__.to_json(event)
