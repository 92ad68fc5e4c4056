"""Input events: what the LLM service and the labellers write for the sidecar to read.

Keyed by ``request_id``:
  * ``RetrievalEvent``   on ``rag.retrieval``  - what was retrieved, with raw scores;
  * ``GenerationDelta``  on ``rag.generation`` - one streamed piece of the answer;
  * ``GenerationFinal``  on ``rag.generation`` - the whole answer, the generator id
    and an optional attention summary (L x H x K lookback ratios, float16, base64);
  * ``FeedbackEvent``    on ``rag.feedback``   - a labelled outcome of an answer.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Final, Literal, Self

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from sidecar.contracts.common import EventBase, FiniteFloat, LabelName, Name, RequestId

MAX_CHUNKS: Final = 1024
"""The most hits a retrieval, and chunks an attention summary, may hold."""


class RetrievalHit(BaseModel):
    """One retrieved chunk, in retrieval order (best first)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    chunk_id: Name = Field(
        description="the chunk's id (1-256 characters): names it in trusted_chunk_ids, "
        "chunk_forecast and evidence_chunk_ids"
    )
    doc_id: Name = Field(description="id of the document the chunk was cut from")
    score: FiniteFloat = Field(description="Raw vector-store score (e.g. Qdrant cosine).")
    text: Annotated[str, StringConstraints(max_length=100_000)] = Field(
        description="the chunk's text: the evidence the answer's claims are checked against"
    )


class RetrievalEvent(EventBase):
    """What the LLM service retrieved for one request."""

    event_type: Literal["retrieval"] = Field(default="retrieval", description="retrieval")
    request_id: RequestId = Field(
        description="the request's id (1-128 characters of letters, digits and . _ : -): "
        "joins this event with the request's generation events; key the record with it"
    )
    tenant: LabelName = Field(
        description="the tenant: picks the policy profile (tenant mapping first) and is part "
        "of the calibration key; with header or fixed tenancy it must equal the trusted "
        "tenant (else dead-lettered: tenant-mismatch)"
    )
    collection: LabelName = Field(
        description="the collection searched: part of the calibration key, and picks the "
        "policy profile when the tenant has no mapping"
    )
    retriever: LabelName = Field(
        default="default", description="Retriever id (embedding model + index), calibration key."
    )
    query: Annotated[str, StringConstraints(max_length=20_000)] = Field(
        description="the user's question: steers the claims' evidence selection (and the "
        "verifier reads it when its model was trained so) and gives the retrieve-again "
        "advice's missing_terms"
    )
    k: int = Field(ge=1, le=MAX_CHUNKS, description="K: how many chunks were asked for.")
    hits: list[RetrievalHit] = Field(
        max_length=MAX_CHUNKS,
        description="the retrieved chunks, best first, at most k; the attention summary's "
        "chunk columns follow this order",
    )
    created_at: datetime | None = Field(
        default=None, description="when the producer wrote it; optional, not read by the sidecar"
    )

    @model_validator(mode="after")
    def _hits_within_k(self) -> Self:
        if len(self.hits) > self.k:
            raise ValueError(f"hits has {len(self.hits)} entries, more than k={self.k}")
        return self


class GenerationDelta(EventBase):
    """One streamed piece of the answer; ``seq`` counts from 0 without gaps."""

    event_type: Literal["generation.delta"] = Field(
        default="generation.delta", description="generation.delta"
    )
    request_id: RequestId = Field(description="the request's id, as on its retrieval event")
    seq: int = Field(
        ge=0,
        le=1_000_000,
        description="the piece's position, from 0 without gaps: pieces are appended in seq "
        "order; a re-sent seq must repeat its text (else dead-lettered: duplicate-conflict)",
    )
    text: Annotated[str, StringConstraints(max_length=100_000)] = Field(
        description="this piece of the answer's text"
    )


# A little-endian float16 is NaN or Inf when its five exponent bits are all set: bits
# 0x7C of its high (second) byte. The high bytes that leave a finite value:
_FINITE_F16_HIGH_BYTES = bytes(b for b in range(256) if b & 0x7C != 0x7C)
# ... and those of a finite value >= 0: 0x00-0x7B, and 0x80 (-0.0 when its low byte is 0;
# a negative subnormal otherwise). Every other high byte is NaN, Inf or a negative value.
_PLAIN_F16_HIGH_BYTES = bytes(b for b in range(256) if b < 0x7C or b == 0x80)
_NEGATIVE_ZERO_F16 = 0x8000  # -0.0 as a little-endian uint16: the largest one allowed


def _base64_decoder() -> Callable[[str], bytes] | None:
    """pydantic-core's base64 decoder (Rust), several times faster than the stdlib's
    binascii (a character at a time) on the 2,160 characters of a 30 x 9 x 3 summary:
    the validator itself (a TypeAdapter's Python wrapper cost ~0.8 us a call) of JSON
    text to bytes. ``None`` where this pydantic does not read JSON bytes as base64
    (``val_json_bytes``): the stdlib decodes every summary then."""
    adapter = TypeAdapter(bytes, config=ConfigDict(val_json_bytes="base64"))
    decode: Callable[[str], bytes] = adapter.validator.validate_json
    try:
        decodes = decode('"QUJD"') == b"ABC"
    except ValidationError:
        return None
    return decode if decodes else None


_BASE64_JSON: Final = _base64_decoder()


def b64decode_strict(text: str) -> bytes:
    """``base64.b64decode(text, validate=True)``: the same bytes, or the same error.

    pydantic-core decodes the text when it can only be read one way: a multiple of
    four ASCII characters, no ``=`` before the last two, none of ``-`` and ``_`` (its
    url-safe alphabet, which the stdlib refuses) and no ``\\`` or ``"`` (a JSON
    escape would spell characters the text does not hold). Everything it accepts
    then, the stdlib accepts with the same bytes (whole quads of the standard
    alphabet, padding at the end); anything else, and anything it refuses (a
    non-canonical last symbol the stdlib reads), is the stdlib's to answer.
    """
    n = len(text)
    if (
        _BASE64_JSON is not None
        and n % 4 == 0
        and text.isascii()
        and text.find("=", 0, n - 2) < 0
        and "-" not in text
        and "_" not in text
        and "\\" not in text
        and '"' not in text
    ):
        try:
            decoded = _BASE64_JSON(f'"{text}"')
        except ValidationError:
            pass
        else:
            return decoded
    return base64.b64decode(text, validate=True)


FLOAT16_MAX: Final = float(np.finfo(np.float16).max)
"""65504: the largest wire value of an attention summary (larger ones are clipped to it)."""


class AttentionSummary(BaseModel):
    """The generator's chunk-wise lookback ratios: L layers x H heads x K chunks.

    ``values`` is base64 of little-endian float16 in C order (layer, head, chunk),
    each finite and >= 0 (-0.0 allowed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: int = Field(ge=1, le=1024, description="L: the generator's attention layers")
    heads: int = Field(ge=1, le=1024, description="H: attention heads per layer")
    chunks: int = Field(
        ge=1,
        le=MAX_CHUNKS,
        description="K: chunk columns, in the retrieval's hit order (1 for variant fc)",
    )
    variant: Literal["cw", "fc"] = Field(
        default="cw", description="cw: chunk-wise lookback ratios; fc: full-context."
    )
    dtype: Literal["float16"] = Field(
        default="float16", description="the element type of values: float16"
    )
    values: str = Field(description="base64 of L*H*K little-endian float16 values, finite, >= 0")

    # the decoded ``values``, kept by the validator: the summary is base64-decoded once. A
    # slot, not a pydantic private attribute: those are set up by a ``model_post_init``
    # that pydantic-core calls back on every validation (~2 us a summary, a third of its
    # decode). Unset on a summary built without validation (``model_construct``), and not
    # carried by ``model_copy`` or pickling: ``decoded`` decodes ``values`` again there.
    __slots__ = ("_raw",)
    if TYPE_CHECKING:
        _raw: bytes

    @model_validator(mode="after")
    def _shape_matches(self) -> Self:
        expected = self.layers * self.heads * self.chunks * 2
        try:
            raw = b64decode_strict(self.values)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"values is not valid base64: {exc}") from None
        if len(raw) != expected:
            raise ValueError(
                f"values holds {len(raw)} bytes, shape {self.layers}x{self.heads}x{self.chunks} "
                f"float16 needs {expected}"
            )
        high = raw[1::2]
        odd = high.translate(None, _PLAIN_F16_HIGH_BYTES)  # bytes only: no array per event
        if odd and odd.translate(None, _FINITE_F16_HIGH_BYTES):  # a high byte of NaN or Inf
            raise ValueError("values contains NaN or Inf")
        # lookback ratios are means of attention probabilities, never below 0 (eq. 8); a
        # negative value would outrank the zero padding in the per-sample scaling.
        # As little-endian uint16, every negative float16 but -0.0 (0x8000) is above 0x8000.
        if odd or (
            b"\x80" in high and int(np.frombuffer(raw, dtype="<u2").max()) > _NEGATIVE_ZERO_F16
        ):
            raise ValueError("values contains a negative lookback ratio (they are >= 0)")
        object.__setattr__(self, "_raw", raw)  # the model is frozen; the slot is not a field
        return self

    def _decoded_or_none(self) -> bytes | None:
        """``_raw``; ``None`` when the validator did not set it."""
        try:
            return self._raw
        except AttributeError:
            return None

    @property
    def decoded_bytes(self) -> int:
        """Bytes the decoded ``values`` hold beside the event (0 when not kept)."""
        raw = self._decoded_or_none()
        return 0 if raw is None else len(raw)

    def decoded(self) -> bytes:
        """The decoded ``values``: L*H*K little-endian float16, C order (layer, head, chunk)."""
        raw = self._decoded_or_none()
        if raw is None:  # built without validation (model_construct)
            raw = base64.b64decode(self.values)
        return raw

    def to_float16(self) -> npt.NDArray[np.float16]:
        """The summary as a read-only float16 view of shape (L, H, K), without a copy."""
        arr = np.frombuffer(self.decoded(), dtype="<f2")
        return arr.reshape(self.layers, self.heads, self.chunks)

    def to_array(self) -> npt.NDArray[np.float32]:
        """The summary as a float32 array of shape (L, H, K)."""
        return self.to_float16().astype(np.float32)

    @classmethod
    def from_array(cls, array: npt.ArrayLike, variant: Literal["cw", "fc"] = "cw") -> Self:
        """The wire form of an ``(L, H, K)`` array of lookback ratios.

        ``ValueError`` for NaN, infinite or negative values (the sidecar
        dead-letters them: eq. 8's ratios are finite and >= 0); values above the
        float16 range (65504) are clipped to it, as the generator-side
        summarisers do, instead of turning into infinities.
        """
        wide = np.asarray(array, dtype=np.float64)
        if wide.ndim != 3:
            raise ValueError(f"attention summary must be 3-d (L, H, K), got shape {wide.shape}")
        if not np.isfinite(wide).all():
            raise ValueError("attention summary values must be finite (found NaN or inf)")
        if (wide < 0.0).any():
            raise ValueError("attention summary values must be >= 0 (lookback ratios)")
        arr = np.minimum(wide, FLOAT16_MAX).astype("<f2")
        layers, heads, chunks = (int(d) for d in arr.shape)
        values = base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")
        return cls(layers=layers, heads=heads, chunks=chunks, variant=variant, values=values)


class GenerationFinal(EventBase):
    """The end of a generation: the whole answer and what the generator knows about it."""

    event_type: Literal["generation.final"] = Field(
        default="generation.final", description="generation.final"
    )
    request_id: RequestId = Field(description="the request's id, as on its retrieval event")
    answer: Annotated[str, StringConstraints(max_length=200_000)] = Field(
        description="the whole answer: what is verified and decided (it may differ from the "
        "streamed deltas: policy reason stream-final-mismatch; the deltas' text in another "
        "Unicode normal form, NFC or NFD, is no difference)"
    )
    generator_model: Name = Field(
        description="the model that generated the answer: the verdict's "
        "model_versions.generator; an attention summary from another generator than the "
        "lookback model's is not scored (unavailable, or dead-lettered: generator-mismatch, "
        "as configured)"
    )
    deltas: int | None = Field(
        default=None, ge=0, description="How many deltas were sent before this event."
    )
    attention: AttentionSummary | None = Field(
        default=None,
        description="the lookback ratios the lookback signal scores; null: a served lookback "
        "model reports this answer unavailable",
    )
    mean_token_logprob: FiniteFloat | None = Field(
        default=None,
        le=0.0,
        description="mean log-probability (natural log, <= 0) of the answer's tokens: a "
        "feature of the calibrated confidence; null when the generator does not give it",
    )


class FeedbackEvent(EventBase):
    """A labelled outcome for an answered request (``rag.feedback``, keyed by request_id).

    Whoever learns whether an answer was right (a user's thumbs, a reviewer, an
    offline grader) publishes it; the sidecar folds it into the fleet coverage
    bound, and ``guardrail train confidence --from-kafka`` refits the calibrated
    confidence on verdicts joined with feedback.
    """

    event_type: Literal["feedback"] = Field(default="feedback", description="feedback")
    request_id: RequestId = Field(description="the answered request the label is for")
    correct: bool = Field(description="was the answer correct?")
    abstained: bool = Field(
        default=False, description="the generator declined to answer (not a hallucination)"
    )
    source: Name = Field(description="who labelled it: user, reviewer, grader, ...")
    created_at: datetime | None = Field(
        default=None, description="when the label was given; optional, not read by the sidecar"
    )


InputEvent = RetrievalEvent | GenerationDelta | GenerationFinal
