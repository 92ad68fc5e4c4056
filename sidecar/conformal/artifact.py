"""The calibration artifact: a versioned JSON document (pydantic v2).

It carries everything needed to certify events (alpha, n, k, q_hat, n1, n2 of the
global calibration and of each Mondrian key) and everything needed to judge
whether it fits the events it scores (retriever, embedding model, collection,
K, chunking, the ground-truth rule beta / s_thres of eq. 1, a hash of the
calibration data, the creation time), plus the alpha-sweep of mean(m1) and
mean(m2) on the calibration set (seed Fig. 4) as a diagnostic.

q_hat = +inf (k > n) is stored as ``null`` with the rank ``k`` and ``n`` kept, so
the file stays plain JSON. Parsing and dumping are pure; reading and writing
files is in :mod:`sidecar.conformal.storage`.

``params_sha256`` is the sha256 of the whole document as canonical JSON (sorted keys,
without the hash itself), written by ``calibrate``: a file whose values were edited
afterwards is refused at load, instead of certifying under its old ``calibration_id``
(audit: q_hat edited to 0.95 in a shipped file loaded, and every chunk became trusted).
A file without it (written before the field existed) loads, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Final, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StringConstraints,
    model_validator,
)

from sidecar.conformal.calibrator import ConformalCalibration, SweepPoint
from sidecar.conformal.mondrian import CalibrationKey, FallbackReason, MondrianCalibration
from sidecar.conformal.quantile import as_alpha
from sidecar.exceptions import ConfigError

__all__ = [
    "ARTIFACT_KIND",
    "SCHEMA_VERSION",
    "CalibrationArtifact",
    "CalibrationEntry",
    "KeyEntry",
    "Provenance",
    "SweepEntry",
    "build_artifact",
    "params_sha256",
    "with_params_sha256",
]

SCHEMA_VERSION: Final = 1
ARTIFACT_KIND: Final = "retrieval-conformal"

NonEmpty = Annotated[str, StringConstraints(min_length=1)]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Alpha = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]
Unit = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _calibration(
    *,
    alpha: float,
    n1: float,
    n2: float,
    n: int,
    k: int,
    q_hat: float | None,
    threshold: float | None,
    n_questions: int,
    n_chunks: int,
) -> ConformalCalibration:
    if (q_hat is None) != (threshold is None):
        raise ValueError("q_hat and threshold must both be null (k > n) or both be numbers")
    if q_hat is not None and threshold is not None and abs(q_hat - (1.0 - threshold)) > 1e-9:
        raise ValueError(f"q_hat ({q_hat!r}) must equal 1 - threshold ({threshold!r})")
    try:
        return ConformalCalibration(
            alpha=as_alpha(alpha),
            n1=n1,
            n2=n2,
            n=n,
            k=k,
            q_hat=math.inf if q_hat is None else q_hat,
            threshold=-math.inf if threshold is None else threshold,
            n_questions=n_questions,
            n_chunks=n_chunks,
        )
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc


class CalibrationEntry(_Model):
    """One conformal calibration (global or per key) as stored."""

    alpha: Alpha
    n1: FiniteFloat
    n2: FiniteFloat
    n: int = Field(ge=0, description="correct calibration chunks (size of the score set)")
    k: int = Field(ge=1, description="rank ceil((n+1)(1-alpha)) of q_hat")
    q_hat: Unit | None = Field(description="null when k > n (q_hat = +inf)")
    threshold: Unit | None = Field(description="1 - q_hat on the normalised scale")
    n_questions: int = Field(ge=0)
    n_chunks: int = Field(ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self.to_calibration()
        return self

    def to_calibration(self) -> ConformalCalibration:
        """The runtime form used by ``certify``."""
        return _calibration(
            alpha=self.alpha,
            n1=self.n1,
            n2=self.n2,
            n=self.n,
            k=self.k,
            q_hat=self.q_hat,
            threshold=self.threshold,
            n_questions=self.n_questions,
            n_chunks=self.n_chunks,
        )

    @classmethod
    def from_calibration(cls, cal: ConformalCalibration) -> CalibrationEntry:
        """Serialisable form of a calibration (+inf stored as null)."""
        return cls(
            alpha=float(cal.alpha),
            n1=cal.n1,
            n2=cal.n2,
            n=cal.n,
            k=cal.k,
            q_hat=cal.q_hat if cal.certifiable else None,
            threshold=cal.threshold if cal.certifiable else None,
            n_questions=cal.n_questions,
            n_chunks=cal.n_chunks,
        )


class SweepEntry(_Model):
    """mean(m1), mean(m2) and coverage at one alpha (seed Fig. 4)."""

    alpha: Alpha
    n: int = Field(ge=0)
    k: int = Field(ge=1)
    q_hat: Unit | None
    threshold: Unit | None = Field(description="normalised-score cut at this alpha")
    m1_mean: Unit
    m2_mean: Unit
    coverage: Unit | None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.q_hat is None) != (self.k > self.n) or (self.q_hat is None) != (
            self.threshold is None
        ):
            raise ValueError(
                f"sweep alpha={self.alpha}: q_hat and threshold are null exactly when k > n"
            )
        return self

    @classmethod
    def from_point(cls, p: SweepPoint) -> SweepEntry:
        """Serialisable form of a sweep point."""
        return cls(
            alpha=float(p.alpha),
            n=p.n,
            k=p.k,
            q_hat=p.q_hat if math.isfinite(p.q_hat) else None,
            threshold=p.threshold if math.isfinite(p.threshold) else None,
            m1_mean=p.m1_mean,
            m2_mean=p.m2_mean,
            coverage=p.coverage,
        )


class KeyEntry(_Model):
    """A Mondrian key, its own calibration and whether it falls back to the global one."""

    tenant: NonEmpty
    collection: NonEmpty
    retriever: NonEmpty
    n_questions: int = Field(ge=0)
    calibration: CalibrationEntry | None = Field(
        description="the key's own calibration; null when its scores could not be normalised"
    )
    fallback_reason: Literal["too-few-samples", "degenerate-scores"] | None
    detail: str

    @property
    def key(self) -> CalibrationKey:
        """The key as a tuple."""
        return CalibrationKey(self.tenant, self.collection, self.retriever)

    @model_validator(mode="after")
    def _fallback_consistent(self) -> Self:
        cal = self.calibration
        if self.fallback_reason is None and (cal is None or cal.q_hat is None):
            raise ValueError(
                f"key {self.key.label}: without a fallback_reason the key needs its own "
                "certifiable calibration (q_hat not null)"
            )
        if self.fallback_reason == "too-few-samples" and (cal is None or cal.q_hat is not None):
            raise ValueError(
                f"key {self.key.label}: fallback 'too-few-samples' needs a calibration with k > n"
            )
        if self.fallback_reason == "degenerate-scores" and cal is not None:
            raise ValueError(
                f"key {self.key.label}: fallback 'degenerate-scores' has no own calibration"
            )
        return self


class Provenance(_Model):
    """Where the calibration data came from, to reproduce it and keep test data disjoint."""

    questions_file: str
    questions_sha256: Sha256
    corpus_files: list[str]
    corpus_sha256: Sha256
    split: Literal["cal", "test", "all"]
    split_seed: int
    cal_fraction: Annotated[float, Field(gt=0.0, lt=1.0)]
    n_questions_total: int = Field(ge=0)
    max_questions: int | None = Field(default=None, ge=1)
    command: str | None = None


class CalibrationArtifact(CalibrationEntry):
    """The versioned calibration file (``schema_version`` 1).

    Its :class:`CalibrationEntry` fields ``alpha .. n_chunks`` are the global calibration
    (pooled over every key); ``mondrian`` holds one entry per (tenant, collection, retriever).
    """

    schema_version: Literal[1]
    kind: Literal["retrieval-conformal"]
    calibration_id: NonEmpty
    created_at: AwareDatetime
    beta: Unit = Field(description="eq. (1) percentile of ROUGE-L; 0 = by document id only")
    s_thres: Unit | None = Field(description="eq. (1) ROUGE-L threshold; null when beta = 0")
    top_k: int = Field(ge=1, description="retrieval depth K")
    chunk_words: int | None = Field(default=None, ge=1)
    tenant: NonEmpty
    collection: NonEmpty
    retriever_id: NonEmpty
    embedding_model_id: NonEmpty
    score_kind: str = Field(default="cosine", description="what the raw scores are")
    data_hash: Sha256
    provenance: Provenance | None = None
    alpha_sweep: list[SweepEntry] = Field(default_factory=list)
    mondrian: list[KeyEntry] = Field(default_factory=list)
    params_sha256: Sha256 | None = Field(
        default=None,
        description="sha256 of the rest of the document (canonical JSON): edits are refused",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self.global_calibration()
        if (self.beta == 0.0) != (self.s_thres is None):
            raise ValueError("s_thres must be null exactly when beta = 0 (document id only)")
        seen: set[CalibrationKey] = set()
        for entry in self.mondrian:
            if entry.key in seen:
                raise ValueError(f"duplicate Mondrian key {entry.key.label}")
            seen.add(entry.key)
            if entry.calibration is not None and entry.calibration.alpha != self.alpha:
                raise ValueError(
                    f"key {entry.key.label}: alpha {entry.calibration.alpha} differs from the "
                    f"artifact's alpha {self.alpha}"
                )
        if self.params_sha256 is not None and params_sha256(self) != self.params_sha256:
            raise ValueError(
                f"its values do not match its params_sha256 {self.params_sha256[:12]}...: the "
                "file was edited after calibration; run `guardrail calibrate retrieval` again "
                "rather than editing a calibration"
            )
        return self

    def global_calibration(self) -> ConformalCalibration:
        """The pooled calibration in its runtime form."""
        return self.to_calibration()

    def sweep_calibrations(self) -> list[ConformalCalibration]:
        """The calibration at every alpha of ``alpha_sweep`` (same n1, n2), to re-evaluate it."""
        return [
            _calibration(
                alpha=p.alpha,
                n1=self.n1,
                n2=self.n2,
                n=p.n,
                k=p.k,
                q_hat=p.q_hat,
                threshold=p.threshold,
                n_questions=self.n_questions,
                n_chunks=self.n_chunks,
            )
            for p in self.alpha_sweep
        ]

    @property
    def global_key(self) -> CalibrationKey:
        """The (tenant, collection, retriever) the artifact was produced for."""
        return CalibrationKey(self.tenant, self.collection, self.retriever_id)

    def dumps(self) -> str:
        """Canonical JSON text (indented, keys in schema order)."""
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> CalibrationArtifact:
        """Parse and validate (raises pydantic's ``ValidationError``; see ``storage.load``)."""
        return cls.model_validate_json(text)


def params_sha256(artifact: CalibrationArtifact) -> str:
    """sha256 of ``artifact`` without its ``params_sha256``, as canonical JSON (sorted keys,
    no spaces; floats as Python writes them, an exact round trip): indentation and key
    order of the file do not change it, any value does."""
    payload = artifact.model_dump(mode="json", exclude={"params_sha256"})
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def with_params_sha256(artifact: CalibrationArtifact) -> CalibrationArtifact:
    """``artifact`` carrying the hash of its values (what ``calibrate`` writes)."""
    return artifact.model_copy(update={"params_sha256": params_sha256(artifact)})


def build_artifact(
    mondrian: MondrianCalibration,
    *,
    global_key: CalibrationKey,
    embedding_model_id: str,
    data_hash: str,
    beta: float,
    s_thres: float | None,
    top_k: int,
    chunk_words: int | None = None,
    sweep: Sequence[SweepPoint] = (),
    provenance: Provenance | None = None,
    score_kind: str = "cosine",
    created_at: datetime | None = None,
) -> CalibrationArtifact:
    """Assemble the artifact from a Mondrian calibration and its metadata.

    ``calibration_id`` is ``retriever@collection:<first 12 hex of data_hash>``.
    """
    g = mondrian.global_calibration
    entries = []
    for key, kc in sorted(mondrian.keys.items()):
        reason: Literal["too-few-samples", "degenerate-scores"] | None
        if kc.fallback_reason is None:
            reason = None
        elif kc.fallback_reason is FallbackReason.TOO_FEW_SAMPLES:
            reason = "too-few-samples"
        elif kc.fallback_reason is FallbackReason.DEGENERATE_SCORES:
            reason = "degenerate-scores"
        else:  # pragma: no cover - calibration only produces the two above
            raise ConfigError(f"unexpected calibration-time fallback {kc.fallback_reason}")
        entries.append(
            KeyEntry(
                tenant=key.tenant,
                collection=key.collection,
                retriever=key.retriever,
                n_questions=kc.n_questions,
                calibration=None if kc.own is None else CalibrationEntry.from_calibration(kc.own),
                fallback_reason=reason,
                detail=kc.detail,
            )
        )
    artifact = CalibrationArtifact(
        schema_version=SCHEMA_VERSION,
        kind=ARTIFACT_KIND,
        calibration_id=f"{global_key.retriever}@{global_key.collection}:{data_hash[:12]}",
        created_at=created_at if created_at is not None else datetime.now(UTC),
        alpha=float(g.alpha),
        n=g.n,
        k=g.k,
        q_hat=g.q_hat if g.certifiable else None,
        threshold=g.threshold if g.certifiable else None,
        n1=g.n1,
        n2=g.n2,
        n_questions=g.n_questions,
        n_chunks=g.n_chunks,
        beta=beta,
        s_thres=s_thres,
        top_k=top_k,
        chunk_words=chunk_words,
        tenant=global_key.tenant,
        collection=global_key.collection,
        retriever_id=global_key.retriever,
        embedding_model_id=embedding_model_id,
        score_kind=score_kind,
        data_hash=data_hash,
        provenance=provenance,
        alpha_sweep=[SweepEntry.from_point(p) for p in sweep],
        mondrian=entries,
    )
    return with_params_sha256(artifact)
